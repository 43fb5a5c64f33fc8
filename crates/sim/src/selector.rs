//! Label and field selectors as the API server parses them from `labelSelector` and
//! `fieldSelector`, shared by list, watch and deletecollection.

use serde_json::Value;

use super::status::ApiError;

/// One requirement of a label selector; all requirements of a selector must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelRequirement {
    /// `key=value` or `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the label is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the label is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelRequirement>);

/// One `field=value` / `field!=value` term of a field selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    /// e.g. `status.phase`.
    pub field: String,
    /// The compared value.
    pub value: String,
    /// `true` for `!=`.
    pub negated: bool,
}

/// A parsed field selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldRequirement>);

/// Label selector plus field selector: the filter of one list, watch or deletecollection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    /// From `labelSelector`.
    pub labels: LabelSelector,
    /// From `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selector {
    /// True when the object passes both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// True when nothing is filtered out.
    pub fn is_empty(&self) -> bool {
        self.labels.0.is_empty() && self.fields.0.is_empty()
    }
}

fn parse_error(detail: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {detail}"))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'
}

/// Checks a label value (empty allowed; at most 63 chars; alphanumeric at both ends).
fn validate_value(v: &str) -> Result<(), ApiError> {
    let ok = v.is_empty()
        || (v.len() <= 63
            && v.chars().all(is_name_char)
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()));
    if ok {
        Ok(())
    } else {
        Err(parse_error(format!(
            "Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

/// Checks a label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 chars.
pub fn validate_key(k: &str) -> Result<(), ApiError> {
    let name = match k.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 || !is_dns_subdomain(prefix) {
                return Err(parse_error(format!(
                    "Invalid value: \"{k}\": prefix part must be a DNS subdomain"
                )));
            }
            name
        }
        None => k,
    };
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(is_name_char)
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(parse_error(format!(
            "Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

/// A DNS-1123 subdomain: dot-separated labels of lowercase alphanumerics and `-`, each
/// alphanumeric at both ends (so `a..b` and `a-.b` are refused, as the API server does),
/// at most 253 chars in all.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(has_label_shape)
}

/// A DNS-1123 label: one label of a subdomain, at most 63 chars.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && has_label_shape(s)
}

fn has_label_shape(s: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.starts_with(alphanumeric)
        && s.ends_with(alphanumeric)
        && s.chars().all(|c| alphanumeric(c) || c == '-')
}

struct Cursor<'a> {
    chars: Vec<char>,
    pos: usize,
    src: &'a str,
}

impl Cursor<'_> {
    fn skip_ws(&mut self) {
        while self.pos < self.chars.len() && self.chars[self.pos].is_whitespace() {
            self.pos += 1;
        }
    }
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }
    fn eat(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        if self.chars.len() >= self.pos + n
            && self.chars[self.pos..self.pos + n]
                .iter()
                .copied()
                .eq(s.chars())
        {
            self.pos += n;
            true
        } else {
            false
        }
    }
    fn word(&mut self) -> String {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_whitespace() || "=!,()".contains(c) {
                break;
            }
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }
    fn at_end(&self) -> bool {
        self.pos >= self.chars.len()
    }
}

impl LabelSelector {
    /// Parses `labelSelector` syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x,y)`,
    /// `a`, `!a`, joined by commas.
    pub fn parse(src: &str) -> Result<LabelSelector, ApiError> {
        let mut cur = Cursor {
            chars: src.chars().collect(),
            pos: 0,
            src,
        };
        let mut reqs = Vec::new();
        cur.skip_ws();
        if cur.at_end() {
            return Ok(LabelSelector(reqs));
        }
        loop {
            cur.skip_ws();
            let negated = cur.eat("!");
            cur.skip_ws();
            let key = cur.word();
            if key.is_empty() {
                return Err(parse_error(format!(
                    "found '{}', expected: identifier",
                    cur.peek().map(String::from).unwrap_or_default()
                )));
            }
            validate_key(&key)?;
            cur.skip_ws();
            let req = if negated {
                LabelRequirement::DoesNotExist(key)
            } else if cur.at_end() || cur.peek() == Some(',') {
                LabelRequirement::Exists(key)
            } else if cur.eat("==") || cur.eat("=") {
                cur.skip_ws();
                let v = cur.word();
                validate_value(&v)?;
                LabelRequirement::Equals(key, v)
            } else if cur.eat("!=") {
                cur.skip_ws();
                let v = cur.word();
                validate_value(&v)?;
                LabelRequirement::NotEquals(key, v)
            } else {
                let op = cur.word();
                if op != "in" && op != "notin" {
                    return Err(parse_error(format!(
                        "found '{op}', expected: in, notin, =, ==, !=, gt, lt (in selector {:?})",
                        cur.src
                    )));
                }
                cur.skip_ws();
                if !cur.eat("(") {
                    return Err(parse_error("found '', expected: '('"));
                }
                let mut values = Vec::new();
                loop {
                    cur.skip_ws();
                    let v = cur.word();
                    validate_value(&v)?;
                    values.push(v);
                    cur.skip_ws();
                    if cur.eat(",") {
                        continue;
                    }
                    if cur.eat(")") {
                        break;
                    }
                    return Err(parse_error("found '', expected: ',', ')' or identifier"));
                }
                if op == "in" {
                    LabelRequirement::In(key, values)
                } else {
                    LabelRequirement::NotIn(key, values)
                }
            };
            reqs.push(req);
            cur.skip_ws();
            if cur.at_end() {
                break;
            }
            if !cur.eat(",") {
                return Err(parse_error(format!(
                    "found '{}', expected: ','",
                    cur.peek().map(String::from).unwrap_or_default()
                )));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// True when the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelRequirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

impl FieldSelector {
    /// Parses `fieldSelector` syntax (`f=v`, `f==v`, `f!=v`, joined by commas), accepting only
    /// the fields in `supported` as the real server does per resource.
    pub fn parse(src: &str, supported: &[&str]) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        for term in src.split(',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{src}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !supported.contains(&field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push(FieldRequirement {
                field: field.to_string(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(FieldSelector(reqs))
    }

    /// True when every term holds; a missing field compares as the empty string.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let pointer = format!("/{}", r.field.replace('.', "/"));
            let actual = match obj.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (actual == r.value) != r.negated
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dns_names_follow_the_api_server_rules() {
        for ok in ["a", "a-b", "a.b", "driver-0.x", "0a"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "a..b",
            "a-.b",
            "a.-b",
            ".a",
            "a.",
            "A",
            "a_b",
            &"a".repeat(254),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(is_dns_label("exec-1"));
        for bad in ["a.b", "-a", "a-", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    use super::*;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "labels": labels}, "status": {"phase": "Pending"}})
    }

    #[test]
    fn set_based_and_equality_selectors_match_like_the_api_server() {
        let p = pod(json!({"spark-exec-id": "2", "spark-role": "executor"}));
        let cases = [
            ("spark-exec-id in (1,2)", true),
            ("spark-exec-id in (1, 3)", false),
            ("spark-exec-id notin (1,3)", true),
            ("spark-role=executor,spark-exec-id==2", true),
            ("spark-role!=executor", false),
            ("missing!=x", true),
            ("missing notin (x)", true),
            ("spark-role", true),
            ("!spark-role", false),
            ("!missing", true),
            ("", true),
        ];
        for (src, want) in cases {
            let sel = LabelSelector::parse(src).unwrap_or_else(|e| panic!("{src}: {e}"));
            assert_eq!(sel.matches(&p), want, "{src}");
        }
    }

    #[test]
    fn malformed_label_selectors_are_bad_requests() {
        for src in ["a in (1,2", "a in 1", "a ~ b", "=x", "a=b c", "a=-x-"] {
            let err = LabelSelector::parse(src).expect_err(src);
            assert_eq!((err.code, err.reason), (400, "BadRequest"), "{src}");
            assert!(
                err.message.starts_with("unable to parse requirement"),
                "{src}: {}",
                err.message
            );
        }
    }

    #[test]
    fn field_selectors_check_the_supported_fields() {
        let p = pod(json!({}));
        let supported = ["metadata.name", "status.phase", "spec.nodeName"];
        assert!(
            FieldSelector::parse("status.phase=Pending", &supported)
                .unwrap()
                .matches(&p)
        );
        assert!(
            !FieldSelector::parse("status.phase!=Pending", &supported)
                .unwrap()
                .matches(&p)
        );
        assert!(
            FieldSelector::parse("spec.nodeName=", &supported)
                .unwrap()
                .matches(&p)
        );
        assert!(
            FieldSelector::parse("metadata.name==p,status.phase=Pending", &supported)
                .unwrap()
                .matches(&p)
        );
        let err = FieldSelector::parse("spec.foo=x", &supported).unwrap_err();
        assert_eq!(err.message, "field label not supported: spec.foo");
        assert_eq!(err.code, 400);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A requirement and its written form, over a small alphabet so matches happen.
        fn requirement() -> impl Strategy<Value = (String, LabelRequirement)> {
            let key = prop::sample::select(vec!["a", "b", "spark-exec-id"]);
            let val = prop::sample::select(vec!["1", "2", "x"]);
            let vals = prop::collection::vec(val.clone(), 1..3);
            prop_oneof![
                (key.clone(), val.clone()).prop_map(|(k, v)| (
                    format!("{k}={v}"),
                    LabelRequirement::Equals(k.into(), v.into())
                )),
                (key.clone(), val.clone()).prop_map(|(k, v)| (
                    format!("{k} != {v}"),
                    LabelRequirement::NotEquals(k.into(), v.into())
                )),
                (key.clone(), vals.clone()).prop_map(|(k, vs)| (
                    format!("{k} in ({})", vs.join(", ")),
                    LabelRequirement::In(k.into(), vs.iter().map(|v| v.to_string()).collect())
                )),
                (key.clone(), vals).prop_map(|(k, vs)| (
                    format!("{k} notin ({})", vs.join(",")),
                    LabelRequirement::NotIn(k.into(), vs.iter().map(|v| v.to_string()).collect())
                )),
                key.clone()
                    .prop_map(|k| (k.to_string(), LabelRequirement::Exists(k.into()))),
                key.prop_map(|k| (format!("!{k}"), LabelRequirement::DoesNotExist(k.into()))),
            ]
        }

        proptest! {
            // A fixed seed keeps the run deterministic.
            #![proptest_config(ProptestConfig {
                rng_seed: proptest::test_runner::RngSeed::Fixed(7),
                failure_persistence: None,
                ..ProptestConfig::default()
            })]
            #[test]
            fn written_selectors_parse_back_and_match_by_their_meaning(
                reqs in prop::collection::vec(requirement(), 1..4),
                labels in prop::collection::btree_map(
                    prop::sample::select(vec!["a", "b", "spark-exec-id"]),
                    prop::sample::select(vec!["1", "2", "x"]),
                    0..3,
                ),
            ) {
                let text: Vec<String> = reqs.iter().map(|(t, _)| t.clone()).collect();
                let parsed = LabelSelector::parse(&text.join(",")).unwrap();
                let expected: Vec<LabelRequirement> = reqs.iter().map(|(_, r)| r.clone()).collect();
                prop_assert_eq!(&parsed.0, &expected);
                let obj = json!({"metadata": {"labels": labels}});
                let get = |k: &str| labels.get(k).copied();
                let want = expected.iter().all(|r| match r {
                    LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
                    LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
                    LabelRequirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
                    LabelRequirement::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
                    LabelRequirement::Exists(k) => get(k).is_some(),
                    LabelRequirement::DoesNotExist(k) => get(k).is_none(),
                });
                prop_assert_eq!(parsed.matches(&obj), want);
            }
        }
    }
}
