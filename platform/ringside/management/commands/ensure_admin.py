"""`manage.py ensure_admin`: the `admin` superuser exists, with RINGSIDE_ADMIN_PASSWORD when set.

Without the variable, a new admin gets a generated password, printed once; an existing admin
keeps theirs.
"""

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the admin user (password from RINGSIDE_ADMIN_PASSWORD, else generated)."

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        password = os.environ.get("RINGSIDE_ADMIN_PASSWORD")
        user = User.objects.filter(username="admin").first()
        if user is None:
            generated = not password
            password = password or secrets.token_urlsafe(12)
            User.objects.create_superuser("admin", "", password)
            if generated:
                self.stdout.write(self.style.WARNING(
                    f"Created user 'admin' with password: {password}\n"
                    "  (shown once; set RINGSIDE_ADMIN_PASSWORD to choose it)"))
        elif password and not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
