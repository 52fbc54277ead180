from django.urls import path

from chat import artifact_views, views

urlpatterns = [
    path("", views.home, name="home"),
    path("chats/new/", views.chat_new, name="chat_new"),
    path("chats/start/", views.chat_start, name="chat_start"),
    path("chats/search/", views.chat_search, name="chat_search"),
    path("chat/<uuid:chat_id>/", views.chat_detail, name="chat_detail"),
    path("chat/<uuid:chat_id>/older/", views.chat_older, name="chat_older"),
    path("chat/<uuid:chat_id>/rename/", views.chat_rename, name="chat_rename"),
    path("chat/<uuid:chat_id>/pin/", views.chat_pin, name="chat_pin"),
    path("chat/<uuid:chat_id>/delete/", views.chat_delete, name="chat_delete"),
    path("chat/<uuid:chat_id>/export.<str:fmt>", views.chat_export, name="chat_export"),
    path("settings/api-keys/", views.api_keys, name="api_keys"),
    path("chat/<uuid:chat_id>/artifacts/", artifact_views.chat_artifacts, name="chat_artifacts"),
    path(
        "chat/<uuid:chat_id>/artifacts.zip",
        artifact_views.chat_artifacts_zip,
        name="chat_artifacts_zip",
    ),
    path("chat/<uuid:chat_id>/attachments/", artifact_views.chat_attach, name="chat_attach"),
    path("artifacts/<uuid:artifact_id>/", artifact_views.artifact_detail, name="artifact_detail"),
    path(
        "artifacts/<uuid:artifact_id>/v<int:number>/download",
        artifact_views.artifact_download,
        name="artifact_download",
    ),
    path(
        "artifacts/<uuid:artifact_id>/v<int:number>/preview",
        artifact_views.artifact_preview,
        name="artifact_preview",
    ),
    path(
        "artifacts/<uuid:artifact_id>/v<int:number>/raw",
        artifact_views.artifact_raw,
        name="artifact_raw",
    ),
]
