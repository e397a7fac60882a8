# Runs test functions of a MicroPython test module inside the Unix port.
# Usage: micropython mpyunit.py MODULE TEST_NAME [TEST_NAME ...]
# Prints one line per test:  MPYTEST PASS name  |  MPYTEST FAIL name  (+ traceback)
import sys


def main():
    mod_name = sys.argv[1]
    names = sys.argv[2:]
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
    sys.exit(1 if failed else 0)


main()
