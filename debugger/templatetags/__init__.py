"""Template filters and tags of the dashboard's pages: formatting and rendered fragments."""
