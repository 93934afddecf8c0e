"""The nested codecs: `sakura` (one importance-aware rendition) and `layered` (a ladder of them
stored once), over the nested quantiser ladder (`ladder`) or the ECSQ coder (`ecsq_coder`).
`layered:quantiser="ecsq"` is the progressive family's ladder, so this family sits above it."""
