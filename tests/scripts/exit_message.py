import sys

print("exiting with a message")
sys.exit("bye")
