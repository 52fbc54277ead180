from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from chat.apikeys import create_api_key


class Command(BaseCommand):
    help = "Create an API key for a user. The key is printed once, alone on the last line."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="command line")

    def handle(self, *args, username, name, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"No user named {username!r}") from None
        key, raw = create_api_key(user, name)
        self.stdout.write(f"Created API key {key.prefix}… for {username}. Store it now:")
        self.stdout.write(raw)
