//! Byte sizes as operators write them in flags and the environment ("16MiB", "1.5GB").
#![no_main]

use libfuzzer_sys::fuzz_target;
use nova_proto::units::ByteSize;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(size) = text.parse::<ByteSize>()
    {
        // What parses must print back to the same size.
        let again: ByteSize = size.to_string().parse().expect("a printed size parses");
        assert_eq!(again.bytes(), size.bytes());
    }
});
