"""Pagination of every API list: `limit`/`offset`, with `limit` capped so that no request can
ask the database for more rows than it can count (an unbounded limit reached PostgreSQL as a
LIMIT beyond bigint: a 500)."""

from rest_framework.pagination import LimitOffsetPagination


class Pagination(LimitOffsetPagination):
    max_limit = 1000
