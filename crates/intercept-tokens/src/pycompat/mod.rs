//! Python's semantics where the renderers depend on them: `json.loads` and `json.dumps`
//! (with object key order kept, as a Python `dict` keeps it) and `str.strip()`'s notion of
//! whitespace.

pub(crate) mod json;
pub(crate) mod text;
