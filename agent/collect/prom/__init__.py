"""`source: prometheus`: reading the fleet from a Prometheus instead of scraping every pod."""
