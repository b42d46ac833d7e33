//! SASL/PLAIN on the Kafka listener, when the star checks tokens (`--auth-tokens`): a client
//! authenticates once per connection, with its token as the password (the user name is not
//! used), and every request after that is allowed what the token's grants allow, exactly as a
//! gRPC call carrying the same token. Before that, only ApiVersions and the SASL requests are
//! served; anything else closes the connection.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ResponseKind, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;

use nova_server::net::{Principal, Tokens};

/// The one mechanism served.
const PLAIN: &str = "PLAIN";

pub fn handshake(request: &SaslHandshakeRequest) -> (ResponseKind, bool) {
    let ok = request.mechanism.eq_ignore_ascii_case(PLAIN);
    let mut response =
        SaslHandshakeResponse::default().with_mechanisms(vec![StrBytes::from_static_str(PLAIN)]);
    if !ok {
        response.error_code = ResponseError::UnsupportedSaslMechanism.code();
    }
    (ResponseKind::SaslHandshake(response), ok)
}

/// Checks a PLAIN exchange (`authzid NUL user NUL password`); the password is the token.
pub fn authenticate(
    tokens: &Tokens,
    request: &SaslAuthenticateRequest,
) -> (ResponseKind, Option<(Arc<Principal>, Bytes)>) {
    let mut parts = request.auth_bytes.splitn(3, |b| *b == 0);
    let (_authzid, _user, password) = (parts.next(), parts.next(), parts.next());
    let outcome = match password {
        Some(token) => {
            let mut bearer = b"Bearer ".to_vec();
            bearer.extend_from_slice(token);
            tokens
                .authenticate(Some(&bearer))
                .map(|principal| (principal, Bytes::copy_from_slice(token)))
                .map_err(|refusal| refusal.to_string())
        }
        None => Err("a PLAIN exchange is authzid NUL user NUL password".to_owned()),
    };
    let mut response = SaslAuthenticateResponse::default().with_auth_bytes(Bytes::new());
    match outcome {
        Ok((principal, token)) => (
            ResponseKind::SaslAuthenticate(response),
            Some((Arc::new(principal), token)),
        ),
        Err(why) => {
            response.error_code = ResponseError::SaslAuthenticationFailed.code();
            response.error_message = Some(StrBytes::from_string(why));
            (ResponseKind::SaslAuthenticate(response), None)
        }
    }
}
