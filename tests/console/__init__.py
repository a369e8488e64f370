"""The web console (txstream/console): its index, JSON API and pages."""
