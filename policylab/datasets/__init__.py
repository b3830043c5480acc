"""Public traces and GPU profiles by name: where they are published, their checksums, and a
local cache (`python -m policylab trace download NAME`, `profile download NAME`).

A clone of the repository carries only the small synthetic traces; the public ones are large
and licensed by their publishers, so they are fetched once from the published URL, checked
against a sha256 and kept in the cache, where `trace=azure_code` and `dataplane.profile=NAME`
find them."""
