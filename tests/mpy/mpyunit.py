# Runs test functions of a MicroPython test module inside the Unix port.
# Usage: micropython mpyunit.py MODULE TEST_NAME [TEST_NAME ...]
# Prints one line per test:  MPYTEST PASS name  |  MPYTEST FAIL name  (+ traceback)
# (tests/mpy32 runs the same in the 32-bit WebAssembly port through run()).
import sys


def run(mod_name, names):
    """Run the named tests of module mod_name; return how many failed."""
    mod = __import__(mod_name)
    failed = 0
    for name in names:
        fn = getattr(mod, name, None)
        if fn is None:
            print("MPYTEST FAIL", name)
            print("no such test function in", mod_name)
            failed += 1
            continue
        try:
            fn()
        except Exception as e:
            print("MPYTEST FAIL", name)
            sys.print_exception(e, sys.stdout)
            failed += 1
        else:
            print("MPYTEST PASS", name)
    return failed


if __name__ == "__main__":
    sys.exit(1 if run(sys.argv[1], sys.argv[2:]) else 0)
