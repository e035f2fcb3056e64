"""placeholder until the TaskGraph moves here."""
