"""`manage.py vocabulary`: write frontend/static/js/vocabulary.js from engine.contract."""

from django.core.management.base import BaseCommand

from ringside.vocabulary import MODULE_PATH, vocabulary_module


class Command(BaseCommand):
    help = "Write the frontend's copy of the contract's enums (frontend/static/js/vocabulary.js)."

    def handle(self, *args, **options) -> None:
        MODULE_PATH.write_text(vocabulary_module())
        self.stdout.write(f"wrote {MODULE_PATH}")
