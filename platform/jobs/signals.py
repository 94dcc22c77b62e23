"""The jobs app's signals, for the apps that follow its rows without it importing them (the
monitor pushes them to the job's websocket)."""

from django.dispatch import Signal

# a command's state moved (delivered, settled) by an update that `post_save` does not see;
# keyword argument `command`, the row as it is now
command_changed = Signal()
