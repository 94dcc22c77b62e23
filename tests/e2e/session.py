"""Browser sessions for the page tests that are not about logging in."""

from django.conf import settings
from django.test import Client
from playwright.sync_api import Page


def log_in(page: Page, live_server_url: str, user) -> None:
    """Give `page`'s browser the session cookie of `user`, logged in through Django's own
    login (a session row in the shared test database), without filling the login form."""
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME]
    page.context.add_cookies([{"name": cookie.key, "value": cookie.value,
                               "url": live_server_url}])
