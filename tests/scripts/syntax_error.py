print("this line is fine")
x = (1,
