from django.urls import path

from chat import views

urlpatterns = [
    path("", views.home, name="home"),
    path("chats/new/", views.chat_new, name="chat_new"),
    path("chat/<uuid:chat_id>/", views.chat_detail, name="chat_detail"),
]
