# tls stand-in for heap measurements in the WebAssembly port (no tls module there):
# an SSLContext that takes the calls mqb_transport makes and holds nothing. The
# real context's heap (mbedTLS) is measured in the Unix port (docs/application.md).
PROTOCOL_TLS_CLIENT = 0
CERT_NONE = 0
CERT_REQUIRED = 2


class SSLContext:
    def __init__(self, protocol):
        self.verify_mode = CERT_NONE

    def load_verify_locations(self, cadata=None):
        pass

    def load_cert_chain(self, cert, key):
        pass

    def wrap_socket(self, sock, server_hostname=None, do_handshake=True):
        raise OSError(95, "no TLS in the wasm32 port")
