//! The header of a safetensors file, read and checked here rather than by the `safetensors` crate.
//!
//! The crate trusts a header's numbers: in a debug build, offsets that end near `usize::MAX` make it
//! panic ("attempt to add with overflow"), and it reads the JSON into a map, which keeps the last of
//! two tensors of one name without a word. So the header is parsed here, once, from one copy of its
//! bytes (a file that changes while it is read cannot show a checked header to one parser and
//! another to the next), every key in file order, and checked with checked arithmetic against
//! everything the crate's `read_metadata` refuses, and for names listed twice. A refusal names the
//! tensor and what is wrong with it.

use std::collections::{HashMap, HashSet};
use std::fmt;

use safetensors::Dtype;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::HEADER_LENGTH_BYTES;

/// The longest header the `safetensors` crate reads.
const MAX_HEADER_BYTES: usize = 100_000_000;

/// The key of the header's string metadata; every other key is a tensor's name.
pub(super) const METADATA_KEY: &str = "__metadata__";

/// The length of the header of a file of `file_len` bytes, from `prefix`, the file's first
/// [`HEADER_LENGTH_BYTES`] bytes (`None` if it is shorter): `Err` with the reason it is not a valid
/// one (too short, or a header that would end past the file or over the format's limit).
pub(super) fn length(
    file_len: u64,
    prefix: Option<[u8; HEADER_LENGTH_BYTES]>,
) -> Result<usize, String> {
    let Some(length) = prefix else {
        return Err(format!(
            "the file is {file_len} bytes, too short for the {HEADER_LENGTH_BYTES}-byte header length"
        ));
    };
    let length = u64::from_le_bytes(length);
    let rest = file_len - HEADER_LENGTH_BYTES as u64;
    // Compared as `u64`: on a 32-bit target a length past the file may not fit a `usize`.
    if length > rest {
        return Err(format!(
            "the header length is {length} bytes, but only {rest} bytes follow it"
        ));
    }
    match usize::try_from(length) {
        Ok(length) if length <= MAX_HEADER_BYTES => Ok(length),
        _ => Err(format!(
            "the header is {length} bytes, over the format's limit of {MAX_HEADER_BYTES}"
        )),
    }
}

/// Parses and checks `header`, the header's bytes, for a file whose data (after the header) holds
/// `data_len` bytes: `Err` with the reason it is not a valid one.
pub(super) fn read(header: &[u8], data_len: u64) -> Result<Header, String> {
    let json = std::str::from_utf8(header).map_err(|e| format!("the header is not UTF-8: {e}"))?;
    parse(json)?.check(data_len)
}

/// A tensor as the header lists it.
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    /// Where its bytes begin and end in the data (after the header), end excluded.
    pub(super) offsets: (usize, usize),
}

/// A checked header: its tensors sorted by name, and its string metadata.
pub(super) struct Header {
    pub(super) tensors: Vec<Entry>,
    pub(super) metadata: HashMap<String, String>,
}

/// The header as written: every tensor in file order and the entries of every `__metadata__`,
/// duplicates kept so that they can be refused.
struct Written {
    tensors: Vec<Entry>,
    metadata: Vec<Vec<(String, String)>>,
}

/// Reads the header's JSON. A reason for refusing it names the entry being read, if any.
fn parse(json: &str) -> Result<Written, String> {
    let mut reading = None;
    let mut deserializer = serde_json::Deserializer::from_str(json);
    let header = (&mut deserializer)
        .deserialize_map(HeaderVisitor {
            reading: &mut reading,
        })
        .and_then(|header| deserializer.end().map(|()| header));
    header.map_err(|e| match reading {
        Some(key) if key == METADATA_KEY => {
            format!("the header's \"{METADATA_KEY}\" is not an object of strings: {e}")
        }
        Some(name) => format!("tensor \"{name}\": {e}"),
        None => format!("the header is not a JSON object of tensors: {e}"),
    })
}

impl Written {
    /// Checks the tensors against a data section of `data_len` bytes: the format's rules, as the
    /// `safetensors` crate applies them, and no name twice.
    fn check(mut self, data_len: u64) -> Result<Header, String> {
        if self.metadata.len() > 1 {
            return Err(format!("\"{METADATA_KEY}\" is listed twice in the header"));
        }
        let metadata = self.metadata.pop().unwrap_or_default();
        if let Some(key) = first_repeated(metadata.iter().map(|(key, _)| key.as_str())) {
            return Err(format!(
                "metadata key \"{key}\" is listed twice in the header"
            ));
        }
        if let Some(name) = first_repeated(self.tensors.iter().map(|t| t.name.as_str())) {
            return Err(format!("tensor \"{name}\" is listed twice in the header"));
        }
        for tensor in &self.tensors {
            tensor.check(data_len)?;
        }
        // The tensors must tile the data, in the order of their offsets, as the crate requires. A
        // tensor of no bytes may begin where another does; the name breaks the tie so that the
        // tensor an error names does not depend on the order of the header.
        self.tensors
            .sort_unstable_by(|a, b| (a.offsets, &a.name).cmp(&(b.offsets, &b.name)));
        let mut covered = 0;
        let mut previous: Option<&Entry> = None;
        for tensor in &self.tensors {
            let (begin, end) = tensor.offsets;
            if begin != covered {
                return Err(match previous {
                    Some(previous) if begin < covered => format!(
                        "tensor \"{}\": offsets {} overlap tensor \"{}\"'s {}",
                        tensor.name,
                        Offsets(tensor.offsets),
                        previous.name,
                        Offsets(previous.offsets)
                    ),
                    Some(previous) => format!(
                        "no tensor holds bytes {} of the data, between tensor \"{}\" and tensor \"{}\"",
                        Offsets((covered, begin)),
                        previous.name,
                        tensor.name
                    ),
                    None => format!(
                        "no tensor holds bytes {} of the data, before tensor \"{}\"",
                        Offsets((covered, begin)),
                        tensor.name
                    ),
                });
            }
            covered = end;
            previous = Some(tensor);
        }
        if (covered as u64) < data_len {
            let place = match previous {
                Some(previous) => format!("after tensor \"{}\"", previous.name),
                None => "and the header lists no tensor".to_string(),
            };
            return Err(format!(
                "no tensor holds bytes [{covered}, {data_len}) of the data, {place}"
            ));
        }
        self.tensors.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Ok(Header {
            tensors: self.tensors,
            metadata: metadata.into_iter().collect(),
        })
    }
}

impl Entry {
    /// Checks the tensor on its own: its offsets within a data section of `data_len` bytes, and
    /// holding exactly its shape's bytes.
    fn check(&self, data_len: u64) -> Result<(), String> {
        let Entry {
            name,
            dtype,
            offsets: (begin, end),
            ..
        } = self;
        let offsets = Offsets(self.offsets);
        let shape = &self.shape;
        if begin > end {
            return Err(format!(
                "tensor \"{name}\": offsets {offsets} end before they begin"
            ));
        }
        if *end as u64 > data_len {
            return Err(format!(
                "tensor \"{name}\": offsets {offsets} end past the data, which holds {data_len} bytes"
            ));
        }
        let elements = self
            .shape
            .iter()
            .try_fold(1usize, |n, &len| n.checked_mul(len))
            .ok_or_else(|| {
                format!(
                    "tensor \"{name}\": shape {shape:?} has more elements than a usize can count"
                )
            })?;
        // In bits, as the crate counts: some dtypes (F4, F6) are less than a byte.
        let bits = elements.checked_mul(dtype.bitsize()).ok_or_else(|| {
            format!(
                "tensor \"{name}\": shape {shape:?} of {dtype} has more bits than a usize can count"
            )
        })?;
        if bits % 8 != 0 {
            return Err(format!(
                "tensor \"{name}\": shape {shape:?} of {dtype} is {bits} bits, not a whole number of bytes"
            ));
        }
        if bits / 8 != end - begin {
            return Err(format!(
                "tensor \"{name}\": shape {shape:?} of {dtype} needs {} bytes but its offsets {offsets} hold {}",
                bits / 8,
                end - begin
            ));
        }
        Ok(())
    }
}

/// The first string of `items` that an earlier one equals.
fn first_repeated<'a>(mut items: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = HashSet::new();
    items.find(|item| !seen.insert(*item))
}

/// A byte range, printed `[begin, end)`.
struct Offsets((usize, usize));

impl fmt::Display for Offsets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Offsets((begin, end)) = self;
        write!(f, "[{begin}, {end})")
    }
}

/// Reads the header's object key by key, where a map would keep only the last of two equal keys.
struct HeaderVisitor<'a> {
    /// The key whose value is being read, for errors.
    reading: &'a mut Option<String>,
}

impl<'de> Visitor<'de> for HeaderVisitor<'_> {
    type Value = Written;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of tensors")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Written, A::Error> {
        let mut header = Written {
            tensors: Vec::new(),
            metadata: Vec::new(),
        };
        while let Some(key) = map.next_key::<String>()? {
            *self.reading = Some(key.clone());
            if key == METADATA_KEY {
                // `null` is no metadata, as the crate reads it.
                let entries: Option<MetadataEntries> = map.next_value()?;
                header
                    .metadata
                    .push(entries.map_or_else(Vec::new, |entries| entries.0));
            } else {
                let TensorFields {
                    dtype,
                    shape,
                    offsets,
                } = map.next_value()?;
                header.tensors.push(Entry {
                    name: key,
                    dtype,
                    shape,
                    offsets,
                });
            }
            *self.reading = None;
        }
        Ok(header)
    }
}

/// The entries of an object of strings, in order, duplicates kept.
struct MetadataEntries(Vec<(String, String)>);

impl<'de> de::Deserialize<'de> for MetadataEntries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;

        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = MetadataEntries;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of strings")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MetadataEntries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, String>()? {
                    entries.push(entry);
                }
                Ok(MetadataEntries(entries))
            }
        }

        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// The fields of a tensor's entry. Others are read and dropped, as the crate drops them; a field
/// given twice is refused, as the crate refuses it.
struct TensorFields {
    dtype: Dtype,
    shape: Vec<usize>,
    offsets: (usize, usize),
}

impl<'de> de::Deserialize<'de> for TensorFields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;

        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = TensorFields;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of dtype, shape and data_offsets")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TensorFields, A::Error> {
                fn set<'de, A: MapAccess<'de>, V: de::Deserialize<'de>>(
                    map: &mut A,
                    field: &'static str,
                    slot: &mut Option<V>,
                ) -> Result<(), A::Error> {
                    if slot.is_some() {
                        return Err(de::Error::duplicate_field(field));
                    }
                    *slot = Some(map.next_value()?);
                    Ok(())
                }

                let (mut dtype, mut shape, mut offsets) = (None, None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "dtype" => set(&mut map, "dtype", &mut dtype)?,
                        "shape" => set(&mut map, "shape", &mut shape)?,
                        "data_offsets" => set(&mut map, "data_offsets", &mut offsets)?,
                        // Read, not skipped with `IgnoredAny`: serde_json limits the nesting of
                        // what it reads (128), as it does for the crate, which reads every value.
                        _ => {
                            map.next_value::<serde_json::Value>()?;
                        }
                    }
                }
                Ok(TensorFields {
                    dtype: dtype.ok_or_else(|| de::Error::missing_field("dtype"))?,
                    shape: shape.ok_or_else(|| de::Error::missing_field("shape"))?,
                    offsets: offsets.ok_or_else(|| de::Error::missing_field("data_offsets"))?,
                })
            }
        }

        deserializer.deserialize_map(FieldsVisitor)
    }
}
