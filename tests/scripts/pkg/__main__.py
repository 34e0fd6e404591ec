import sys

from . import util

print("pkg main", __name__, __package__, sys.argv[1:], callable(util.make_net))
