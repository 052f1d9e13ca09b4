"""Operations: health, readiness and the Prometheus scrape."""
