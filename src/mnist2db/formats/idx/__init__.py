"""IDX files: the header and its rules, every way of reading them, the scan info reports."""
