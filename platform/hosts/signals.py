"""`host_available`: a host can take placements it could not take before. Sent (sender=Host,
host=the Host) when a worker registers its host (new, or taking a name over), when a beat
brings back a host that was lost (a link restored) or re-creates its deleted row, and when
staff undrain it. The jobs app connects its scheduler here (hosts never imports jobs), so a
job waiting for hosts is placed as soon as one comes, not at the next periodic pass."""

from django.dispatch import Signal

host_available = Signal()
