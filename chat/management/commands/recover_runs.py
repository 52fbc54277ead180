from django.core.management.base import BaseCommand

from chat.runhost.transitions import recover_stale_runs


class Command(BaseCommand):
    help = "Mark runs left running by a dead process as interrupted (keeping their partial text)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--all",
            action="store_true",
            help="every running run (start-up of the in-process runner), not only stale ones",
        )

    def handle(self, *args, **options):
        recovered = recover_stale_runs(everything=options["all"])
        self.stdout.write(f"Recovered {len(recovered)} interrupted run(s).")
