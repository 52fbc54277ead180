"""Demo accounts for local use: admin, teacher, student, student2.

Never run by migrations, and refused when DEBUG is off (unless --force), so a
production database never gets accounts with a known password.
"""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from chat.catalog import ensure_panel_agent
from chat.management.commands.load_sample_chat import load_sample_chat
from chat.models import ChatSession
from chat.roles import TEACHERS_GROUP
from chat.sample import SAMPLE_TITLE

PASSWORD_FILE = settings.BASE_DIR / ".lyceum-demo-password"
DEMO_USERS = [
    ("admin", "admin"),
    ("teacher", "teacher"),
    ("student", "student"),
    ("student2", "student"),
]


def demo_password() -> tuple[str, str]:
    """The password and where it came from: env, the stored file, or freshly generated."""
    if settings.LYCEUM_DEMO_PASSWORD:
        return settings.LYCEUM_DEMO_PASSWORD, "LYCEUM_DEMO_PASSWORD"
    if PASSWORD_FILE.exists():
        stored = PASSWORD_FILE.read_text().strip()
        if stored:
            return stored, str(PASSWORD_FILE.name)
    password = secrets.token_urlsafe(12)
    PASSWORD_FILE.write_text(password + "\n")
    PASSWORD_FILE.chmod(0o600)
    return password, f"{PASSWORD_FILE.name} (new)"


class Command(BaseCommand):
    help = "Create or refresh the demo accounts (local use only)."

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="run even when DEBUG is off")

    def handle(self, *args, force=False, **options):
        if not settings.DEBUG and not force:
            raise CommandError("Refusing to create demo accounts with DEBUG off (use --force).")
        password, source = demo_password()
        teachers, _ = Group.objects.get_or_create(name=TEACHERS_GROUP)
        User = get_user_model()
        for username, role in DEMO_USERS:
            user, created = User.objects.get_or_create(username=username)
            user.is_staff = user.is_superuser = role == "admin"
            if created or not user.check_password(password):
                user.set_password(password)
            user.save()
            if role == "teacher":
                user.groups.add(teachers)
            if (
                role == "student"
                and not ChatSession.objects.filter(owner=user, title=SAMPLE_TITLE).exists()
            ):
                load_sample_chat(user)
        ensure_panel_agent()
        names = ", ".join(name for name, _ in DEMO_USERS)
        self.stdout.write(f"Demo accounts: {names}")
        self.stdout.write(f"Demo password ({source}): {password}")
