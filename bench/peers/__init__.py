"""The peers Orchard is measured against: the stdlib floor server and SWE-ReX's remote server."""
