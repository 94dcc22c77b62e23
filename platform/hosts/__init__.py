"""The host registry: every machine running `manage.py worker` is a Host with its devices and
slots, kept alive by the worker's beat. hosts never imports jobs; the jobs app points at it
(reservations) and reads it."""
