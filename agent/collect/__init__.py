"""Collection: discover targets, scrape, parse, normalise through the mapping files, keep the
window, and build the `Snapshot`. A payload walks discovery -> scrape -> parse -> normalise ->
store -> snapshot, with no back and forth."""
