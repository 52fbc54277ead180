from django.urls import path

from chat.relay import views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="relay_chat_completions"),
    path("models", views.models, name="relay_models"),
]
