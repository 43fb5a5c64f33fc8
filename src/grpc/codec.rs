//! The API's protobuf codec: prost's, except that a request that does not decode (invalid
//! UTF-8 in a string field, a truncated field) is the caller's mistake and answers
//! INVALID_ARGUMENT, where tonic's codec answers INTERNAL for every decode error. A response
//! that does not decode on the client side stays INTERNAL (the server is at fault).
use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::proto;

/// The code a message that fails to decode answers with: the sender's fault for requests,
/// the server's for responses.
pub trait DecodeFailure {
    const CODE: Code;
}

macro_rules! decode_failure {
    ($code:expr => $($message:ty),+ $(,)?) => {
        $(impl DecodeFailure for $message {
            const CODE: Code = $code;
        })+
    };
}

decode_failure!(Code::InvalidArgument =>
    proto::StartRequest,
    proto::SetTotalExpectedRequest,
    proto::IsDeletedRequest,
    proto::UpdateRegisteredExecutorsRequest,
    proto::StopRequest,
    proto::GetStatusRequest,
    proto::WatchExecutorsRequest,
);
decode_failure!(Code::Internal =>
    proto::StartResponse,
    proto::SetTotalExpectedResponse,
    proto::IsDeletedResponse,
    proto::UpdateRegisteredExecutorsResponse,
    proto::StopResponse,
    proto::ApplicationStatus,
    proto::ExecutorEvent,
);

/// [`ProstCodec`] with decode errors coded by [`DecodeFailure`]; the generated server and
/// client use it (`codec_path` in build.rs).
#[derive(Debug, Clone)]
pub struct ApiCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for ApiCodec<T, U> {
    fn default() -> Self {
        Self {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for ApiCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + DecodeFailure + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ApiDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ApiDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::default()))
    }
}

/// Decodes like prost and answers [`DecodeFailure::CODE`] when the bytes are not a `U`.
#[derive(Debug, Clone)]
pub struct ApiDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default + DecodeFailure> Decoder for ApiDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            Status::new(
                U::CODE,
                format!("the message does not decode: {}", status.message()),
            )
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
