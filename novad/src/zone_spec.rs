//! `--s3-express-zone`'s value: a zone's name and where its bucket (or directory) is. Parsed
//! with the flags, before anything opens a store.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// One `--s3-express-zone`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneSpec {
    pub name: String,
    pub place: ZonePlace,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZonePlace {
    /// An S3 bucket, at `endpoint` when it differs from the regional store's.
    Bucket {
        bucket: String,
        endpoint: Option<String>,
    },
    /// A local directory: for trying Express out on one machine.
    Dir(PathBuf),
}

impl FromStr for ZoneSpec {
    type Err = String;

    fn from_str(spec: &str) -> Result<Self, String> {
        let (mut name, mut bucket, mut endpoint, mut dir) = (None, None, None, None);
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            let slot = match key {
                "name" => &mut name,
                "bucket" => &mut bucket,
                "endpoint" => &mut endpoint,
                "dir" => &mut dir,
                other => {
                    return Err(format!(
                        "unknown key {other:?} (expected name, bucket, endpoint or dir)"
                    ));
                }
            };
            if value.is_empty() {
                return Err(format!("{key} is empty"));
            }
            if slot.replace(value.to_owned()).is_some() {
                return Err(format!("{key} is given twice"));
            }
        }
        let name = name.ok_or("a zone needs a name=")?;
        let place = match (bucket, dir) {
            (Some(bucket), None) => ZonePlace::Bucket { bucket, endpoint },
            (None, Some(dir)) if endpoint.is_none() => ZonePlace::Dir(dir.into()),
            (None, Some(_)) => return Err("endpoint= goes with bucket=, not dir=".into()),
            (Some(_), Some(_)) => return Err("give bucket= or dir=, not both".into()),
            (None, None) => return Err(format!("zone {name:?} needs bucket= (or dir=)")),
        };
        Ok(ZoneSpec { name, place })
    }
}

impl fmt::Display for ZoneSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "name={}", self.name)?;
        match &self.place {
            ZonePlace::Bucket { bucket, endpoint } => {
                write!(f, ",bucket={bucket}")?;
                if let Some(endpoint) = endpoint {
                    write!(f, ",endpoint={endpoint}")?;
                }
                Ok(())
            }
            ZonePlace::Dir(dir) => write!(f, ",dir={}", dir.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_specs_parse_and_refuse_clearly() {
        let zone: ZoneSpec = "name=use1-az1,bucket=nova-az1".parse().unwrap();
        assert_eq!(zone.name, "use1-az1");
        assert_eq!(
            zone.place,
            ZonePlace::Bucket {
                bucket: "nova-az1".into(),
                endpoint: None
            }
        );
        let zone: ZoneSpec = "name=b, bucket=x, endpoint=http://127.0.0.1:9000"
            .parse()
            .unwrap();
        assert_eq!(
            zone.to_string(),
            "name=b,bucket=x,endpoint=http://127.0.0.1:9000"
        );
        let zone: ZoneSpec = "name=c,dir=/tmp/zone-c".parse().unwrap();
        assert_eq!(zone.place, ZonePlace::Dir("/tmp/zone-c".into()));
        for (bad, says) in [
            ("bucket=x", "name="),
            ("name=a", "needs bucket="),
            ("name=a,bucket=x,dir=/y", "not both"),
            ("name=a,dir=/y,endpoint=http://e", "goes with bucket="),
            ("name=a,bucket=x,region=y", "unknown key"),
            ("name=a,name=b,bucket=x", "twice"),
            ("name=a,bucket", "key=value"),
        ] {
            let err = bad.parse::<ZoneSpec>().unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
