"""The flat bundle: one blob read in place, for readers in any language.

Layout (all integers little-endian u32; docs/bundle-format.md has the
details): magic `WARMENV\\x01`, format version, manifest length and JSON,
namespace count and sorted (length, UTF-8) names, entry count and sorted
20-byte index entries (namespace id, key offset, key length, value offset,
value length; offsets relative to the data section), in format 2 then 16
bytes per entry of what it carries (f64 written_at, f64 cost, NaN: unknown),
then the data.

The package holds everything of it, a module per side of the file:
`layout` (the magic, the format versions and the fixed-size records both
sides agree on), `bundle` (the reader a caller holds, `FlatBundle`, and the
format's entry in the registry, `FlatFormat`) and `staging` (the writer
export fills). Nothing outside it reads or writes a flat bundle's bytes.
"""
