//! The shared object-store suite, run against both backends: the local directory store and S3
//! through aws-sdk-s3 against a real moto server.

use std::sync::Arc;

use nova_core::object_store::{
    LocalStore, ObjectStore, S3Config, S3Store, StoreLimits, conformance,
};
use nova_testkit::Moto;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path(), StoreLimits::default()).unwrap();
    conformance::run_all(Arc::new(store), "suite/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_store_conforms_against_moto() {
    let moto = Moto::start();
    moto.create_bucket("conformance");
    let mut config = S3Config::new("conformance");
    config.endpoint = Some(moto.endpoint());
    config.credentials = Some(("test".into(), "testtest".into()));
    config.prefix = "tenant-a".into();
    let store = S3Store::new(config).await;
    let store: Arc<dyn ObjectStore> = Arc::new(store);
    conformance::run_all(store.clone(), "suite/").await;
    // The store prefix isolates: nothing written above is visible from another prefix.
    let mut other = S3Config::new("conformance");
    other.endpoint = Some(moto.endpoint());
    other.credentials = Some(("test".into(), "testtest".into()));
    other.prefix = "tenant-b/".into();
    let other = S3Store::new(other).await;
    assert!(other.list("", None, 10).await.unwrap().objects.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_errors_are_classified() {
    let moto = Moto::start();
    let mut config = S3Config::new("no-such-bucket");
    config.endpoint = Some(moto.endpoint());
    config.credentials = Some(("test".into(), "testtest".into()));
    let store = S3Store::new(config).await;
    let err = store.put("k", "v".into()).await.unwrap_err();
    assert!(
        !err.is_retryable(),
        "a missing bucket is not worth retrying: {err}"
    );

    // A server that is gone is a transient failure.
    let port = moto.port();
    drop(moto);
    let mut config = S3Config::new("b");
    config.endpoint = Some(format!("http://127.0.0.1:{port}"));
    config.credentials = Some(("test".into(), "testtest".into()));
    config.max_attempts = 1;
    let store = S3Store::new(config).await;
    let err = store.put("k", "v".into()).await.unwrap_err();
    assert!(
        err.is_retryable(),
        "an unreachable server is retryable: {err}"
    );
}
