# socket stand-in for the WebAssembly port, which has none: lets mqb_transport be
# imported by tests that need no network; any use raises OSError (ENOTSUP-like).
AF_INET = 2
SOCK_STREAM = 1
SOL_SOCKET = 1
SO_REUSEADDR = 4
IPPROTO_TCP = 6
TCP_NODELAY = 1


def _none(*args, **kw):
    raise OSError(95, "no sockets in the wasm32 test port")


getaddrinfo = _none
socket = _none
