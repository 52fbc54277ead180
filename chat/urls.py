from django.urls import path

from chat import views

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
]
