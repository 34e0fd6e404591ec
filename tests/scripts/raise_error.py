"""Raises ValueError from inside a function after printing a line."""


def inner(value):
    raise ValueError(f"bad value {value}")


def outer():
    inner(42)


print("before the error")
outer()
print("never printed")
