"""What every app of the platform may use and none owns: checked addresses, user text, bounded
JSON parsing, local service processes. It imports no app and not the project (`ringside`)."""
