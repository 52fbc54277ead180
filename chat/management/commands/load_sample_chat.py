from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from chat import store
from chat.sample import SAMPLE_TITLE, sample_channels


def load_sample_chat(user):
    channels = sample_channels()
    chat = store.create_chat(user, title=SAMPLE_TITLE, model="demo")
    store.persist_context(chat.pk, channels.context, 0)
    store.append_display_messages(chat.pk, channels.display)
    return chat


class Command(BaseCommand):
    help = "Create a chat holding a sample transcript (every display type) for a user."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"No user named {username!r}") from None
        chat = load_sample_chat(user)
        self.stdout.write(f"Sample chat {chat.pk} created for {username}.")
