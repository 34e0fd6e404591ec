import sys

print("name", __name__)
print("argv", sys.argv)
print("path0", sys.path[0])
print("file", __file__)
print("main", sys.modules["__main__"].__dict__ is globals())
