import helper_mod

print(helper_mod.GREETING)
