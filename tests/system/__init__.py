"""The whole system, as users run it, with Spark and a broker: demos, crashes, clusters,
outages, the soak."""
