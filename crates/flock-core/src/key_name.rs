//! A copy of a key name kept beside what the module tracks per key (the bindings of a
//! connection, a due deadline's key): inline when it is short, as most lock names are, boxed
//! beyond. No allocation per grant for a short name: an allocator call costs about as much as
//! the rest of binding a grant.

/// The longest name kept inline.
const INLINE_NAME: usize = 22;

/// 24 bytes (with `Option`'s tag in the enum's).
#[derive(Clone)]
pub enum KeyName {
    Inline { len: u8, bytes: [u8; INLINE_NAME] },
    Boxed(Box<[u8]>),
}

// The enum's tag leaves room for Option's: an empty slot costs nothing more.
const _: () = assert!(std::mem::size_of::<Option<KeyName>>() == 24);

impl KeyName {
    pub fn new(name: &[u8]) -> KeyName {
        let mut bytes = [0u8; INLINE_NAME];
        match (bytes.get_mut(..name.len()), u8::try_from(name.len())) {
            (Some(inline), Ok(len)) => {
                inline.copy_from_slice(name);
                KeyName::Inline { len, bytes }
            }
            _ => KeyName::Boxed(name.into()),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            KeyName::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or(&[]),
            KeyName::Boxed(b) => b,
        }
    }
}
