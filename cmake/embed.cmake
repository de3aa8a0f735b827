# Writes the bytes of IN as a C array `mg_descriptor_set` into OUT.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* Generated from the proto/ descriptor set; do not edit. */\n#include <stddef.h>\n\
extern const unsigned char mg_descriptor_set[];\nextern const size_t mg_descriptor_set_len;\n\
const unsigned char mg_descriptor_set[] = {\n${body}\n};\nconst size_t mg_descriptor_set_len = ${len};\n")
