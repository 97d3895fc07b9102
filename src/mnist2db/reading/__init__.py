"""The reading API: open_db, the datasets it returns, and how their records are decoded."""
