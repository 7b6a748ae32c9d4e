"""Indexing: a model's row from a meta build (record), the indexers that write rows for each source (indexer;
hub, with the hub's listing in hub_listing)."""
