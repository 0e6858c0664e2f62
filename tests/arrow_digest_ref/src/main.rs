//! Prints, for each Parquet file given, the hex SHA3-256 arrow-digest `RecordDigestV0` of its records,
//! read in batches of `BATCH` rows as kamu's `get_parquet_logical_hash` reads them.
use arrow::record_batch::RecordBatchReader;
use arrow_digest::{RecordDigest, RecordDigestV0};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn main() {
    let batch: usize = std::env::var("BATCH").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    for path in std::env::args().skip(1) {
        let file = std::fs::File::open(&path).expect("open");
        let reader = ParquetRecordBatchReaderBuilder::try_new(file).expect("parquet")
            .with_batch_size(batch).build().expect("reader");
        let mut hasher = RecordDigestV0::<sha3::Sha3_256>::new(&reader.schema());
        for b in reader {
            hasher.update(&b.expect("batch"));
        }
        let digest = hasher.finalize();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        println!("{path}\t{hex}");
    }
}
