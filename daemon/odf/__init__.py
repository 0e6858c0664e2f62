"""Open Data Fabric datasets of the entities (docs/odf.md): in come the changelog's committed Delta commits;
out go the hash-linked metadata chain (`refs/head`, `blocks/`), its data slices (`data/`) and the chain's check
for `lakefeed verify`."""
