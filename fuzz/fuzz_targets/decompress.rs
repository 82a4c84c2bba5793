//! Decompression of arbitrary bytes, for every codec: it yields exactly one
//! page or an error, never a panic, a hang or an out-of-bounds access.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uzswap_cache::{Codec, PAGE_SIZE};

fuzz_target!(|data: &[u8]| {
    let Some((&tag, src)) = data.split_first() else {
        return;
    };
    let Some(codec) = Codec::from_u8(tag % 4) else {
        return;
    };
    let mut page = vec![0u8; PAGE_SIZE];
    let _ = codec.decompress(src, &mut page);
});
