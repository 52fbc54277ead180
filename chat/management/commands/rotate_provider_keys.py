"""Encrypt every provider key with the current secret (after changing it, or to encrypt
keys stored in clear).

    LYCEUM_PROVIDER_KEY_SECRET=<new> LYCEUM_PROVIDER_KEY_SECRET_OLD=<old> \\
        python manage.py rotate_provider_keys

Keys that neither secret decrypts are reported and left as they are (exit status 1).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from chat.models import Provider, ProviderKey
from chat.relay import secrets


class Command(BaseCommand):
    help = "Re-encrypt provider keys with LYCEUM_PROVIDER_KEY_SECRET (decrypting with the old one)."

    def add_arguments(self, parser):
        parser.add_argument("--old-secret", default="", help="the previous secret (or ..._OLD)")

    def handle(self, *args, old_secret: str = "", **options):
        done = failed = 0
        with transaction.atomic():
            for row, field in [(p, "api_key") for p in Provider.objects.select_for_update()] + [
                (k, "secret") for k in ProviderKey.objects.select_for_update()
            ]:
                value = getattr(row, field)
                if not value:
                    continue
                try:
                    setattr(row, field, secrets.rotate(value, old_secret))
                except secrets.UndecryptableKey:
                    failed += 1
                    self.stderr.write(f"cannot decrypt the key of {row}: left as it was")
                    continue
                row.save(update_fields=[field])
                done += 1
        self.stdout.write(f"{done} key(s) encrypted with the current secret")
        if failed:
            raise CommandError(f"{failed} key(s) could not be decrypted")
