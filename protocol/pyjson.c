/* pyjson.c -- Python-compatible JSON (what json.dumps() writes and json.loads()
 * accepts, with ints and floats kept apart) and Python's repr() of JSON values. */
#include "pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/alloc.h"
#include "util/hex.h"

/* ======================================================================== */
/* Unicode helpers                                                          */
/* ======================================================================== */

/* Code points above U+007F that Python 3.11 (Unicode 14.0) reports as not
 * printable, as inclusive ranges. Generated, not hand-written:
 *   python3 -c "[print(hex(c)) for c in range(0x80, 0x110000)
 *                if not chr(c).isprintable()]"  (then merged into ranges).
 * A newer Python may print a few more characters (newly assigned ones); the repr
 * then differs only by escaping them. */
static const uint32_t nonprint[][2] = {
    {0x80, 0xa0},       {0xad, 0xad},       {0x378, 0x379},     {0x380, 0x383},
    {0x38b, 0x38b},     {0x38d, 0x38d},     {0x3a2, 0x3a2},     {0x530, 0x530},
    {0x557, 0x558},     {0x58b, 0x58c},     {0x590, 0x590},     {0x5c8, 0x5cf},
    {0x5eb, 0x5ee},     {0x5f5, 0x605},     {0x61c, 0x61c},     {0x6dd, 0x6dd},
    {0x70e, 0x70f},     {0x74b, 0x74c},     {0x7b2, 0x7bf},     {0x7fb, 0x7fc},
    {0x82e, 0x82f},     {0x83f, 0x83f},     {0x85c, 0x85d},     {0x85f, 0x85f},
    {0x86b, 0x86f},     {0x88f, 0x897},     {0x8e2, 0x8e2},     {0x984, 0x984},
    {0x98d, 0x98e},     {0x991, 0x992},     {0x9a9, 0x9a9},     {0x9b1, 0x9b1},
    {0x9b3, 0x9b5},     {0x9ba, 0x9bb},     {0x9c5, 0x9c6},     {0x9c9, 0x9ca},
    {0x9cf, 0x9d6},     {0x9d8, 0x9db},     {0x9de, 0x9de},     {0x9e4, 0x9e5},
    {0x9ff, 0xa00},     {0xa04, 0xa04},     {0xa0b, 0xa0e},     {0xa11, 0xa12},
    {0xa29, 0xa29},     {0xa31, 0xa31},     {0xa34, 0xa34},     {0xa37, 0xa37},
    {0xa3a, 0xa3b},     {0xa3d, 0xa3d},     {0xa43, 0xa46},     {0xa49, 0xa4a},
    {0xa4e, 0xa50},     {0xa52, 0xa58},     {0xa5d, 0xa5d},     {0xa5f, 0xa65},
    {0xa77, 0xa80},     {0xa84, 0xa84},     {0xa8e, 0xa8e},     {0xa92, 0xa92},
    {0xaa9, 0xaa9},     {0xab1, 0xab1},     {0xab4, 0xab4},     {0xaba, 0xabb},
    {0xac6, 0xac6},     {0xaca, 0xaca},     {0xace, 0xacf},     {0xad1, 0xadf},
    {0xae4, 0xae5},     {0xaf2, 0xaf8},     {0xb00, 0xb00},     {0xb04, 0xb04},
    {0xb0d, 0xb0e},     {0xb11, 0xb12},     {0xb29, 0xb29},     {0xb31, 0xb31},
    {0xb34, 0xb34},     {0xb3a, 0xb3b},     {0xb45, 0xb46},     {0xb49, 0xb4a},
    {0xb4e, 0xb54},     {0xb58, 0xb5b},     {0xb5e, 0xb5e},     {0xb64, 0xb65},
    {0xb78, 0xb81},     {0xb84, 0xb84},     {0xb8b, 0xb8d},     {0xb91, 0xb91},
    {0xb96, 0xb98},     {0xb9b, 0xb9b},     {0xb9d, 0xb9d},     {0xba0, 0xba2},
    {0xba5, 0xba7},     {0xbab, 0xbad},     {0xbba, 0xbbd},     {0xbc3, 0xbc5},
    {0xbc9, 0xbc9},     {0xbce, 0xbcf},     {0xbd1, 0xbd6},     {0xbd8, 0xbe5},
    {0xbfb, 0xbff},     {0xc0d, 0xc0d},     {0xc11, 0xc11},     {0xc29, 0xc29},
    {0xc3a, 0xc3b},     {0xc45, 0xc45},     {0xc49, 0xc49},     {0xc4e, 0xc54},
    {0xc57, 0xc57},     {0xc5b, 0xc5c},     {0xc5e, 0xc5f},     {0xc64, 0xc65},
    {0xc70, 0xc76},     {0xc8d, 0xc8d},     {0xc91, 0xc91},     {0xca9, 0xca9},
    {0xcb4, 0xcb4},     {0xcba, 0xcbb},     {0xcc5, 0xcc5},     {0xcc9, 0xcc9},
    {0xcce, 0xcd4},     {0xcd7, 0xcdc},     {0xcdf, 0xcdf},     {0xce4, 0xce5},
    {0xcf0, 0xcf0},     {0xcf3, 0xcff},     {0xd0d, 0xd0d},     {0xd11, 0xd11},
    {0xd45, 0xd45},     {0xd49, 0xd49},     {0xd50, 0xd53},     {0xd64, 0xd65},
    {0xd80, 0xd80},     {0xd84, 0xd84},     {0xd97, 0xd99},     {0xdb2, 0xdb2},
    {0xdbc, 0xdbc},     {0xdbe, 0xdbf},     {0xdc7, 0xdc9},     {0xdcb, 0xdce},
    {0xdd5, 0xdd5},     {0xdd7, 0xdd7},     {0xde0, 0xde5},     {0xdf0, 0xdf1},
    {0xdf5, 0xe00},     {0xe3b, 0xe3e},     {0xe5c, 0xe80},     {0xe83, 0xe83},
    {0xe85, 0xe85},     {0xe8b, 0xe8b},     {0xea4, 0xea4},     {0xea6, 0xea6},
    {0xebe, 0xebf},     {0xec5, 0xec5},     {0xec7, 0xec7},     {0xece, 0xecf},
    {0xeda, 0xedb},     {0xee0, 0xeff},     {0xf48, 0xf48},     {0xf6d, 0xf70},
    {0xf98, 0xf98},     {0xfbd, 0xfbd},     {0xfcd, 0xfcd},     {0xfdb, 0xfff},
    {0x10c6, 0x10c6},   {0x10c8, 0x10cc},   {0x10ce, 0x10cf},   {0x1249, 0x1249},
    {0x124e, 0x124f},   {0x1257, 0x1257},   {0x1259, 0x1259},   {0x125e, 0x125f},
    {0x1289, 0x1289},   {0x128e, 0x128f},   {0x12b1, 0x12b1},   {0x12b6, 0x12b7},
    {0x12bf, 0x12bf},   {0x12c1, 0x12c1},   {0x12c6, 0x12c7},   {0x12d7, 0x12d7},
    {0x1311, 0x1311},   {0x1316, 0x1317},   {0x135b, 0x135c},   {0x137d, 0x137f},
    {0x139a, 0x139f},   {0x13f6, 0x13f7},   {0x13fe, 0x13ff},   {0x1680, 0x1680},
    {0x169d, 0x169f},   {0x16f9, 0x16ff},   {0x1716, 0x171e},   {0x1737, 0x173f},
    {0x1754, 0x175f},   {0x176d, 0x176d},   {0x1771, 0x1771},   {0x1774, 0x177f},
    {0x17de, 0x17df},   {0x17ea, 0x17ef},   {0x17fa, 0x17ff},   {0x180e, 0x180e},
    {0x181a, 0x181f},   {0x1879, 0x187f},   {0x18ab, 0x18af},   {0x18f6, 0x18ff},
    {0x191f, 0x191f},   {0x192c, 0x192f},   {0x193c, 0x193f},   {0x1941, 0x1943},
    {0x196e, 0x196f},   {0x1975, 0x197f},   {0x19ac, 0x19af},   {0x19ca, 0x19cf},
    {0x19db, 0x19dd},   {0x1a1c, 0x1a1d},   {0x1a5f, 0x1a5f},   {0x1a7d, 0x1a7e},
    {0x1a8a, 0x1a8f},   {0x1a9a, 0x1a9f},   {0x1aae, 0x1aaf},   {0x1acf, 0x1aff},
    {0x1b4d, 0x1b4f},   {0x1b7f, 0x1b7f},   {0x1bf4, 0x1bfb},   {0x1c38, 0x1c3a},
    {0x1c4a, 0x1c4c},   {0x1c89, 0x1c8f},   {0x1cbb, 0x1cbc},   {0x1cc8, 0x1ccf},
    {0x1cfb, 0x1cff},   {0x1f16, 0x1f17},   {0x1f1e, 0x1f1f},   {0x1f46, 0x1f47},
    {0x1f4e, 0x1f4f},   {0x1f58, 0x1f58},   {0x1f5a, 0x1f5a},   {0x1f5c, 0x1f5c},
    {0x1f5e, 0x1f5e},   {0x1f7e, 0x1f7f},   {0x1fb5, 0x1fb5},   {0x1fc5, 0x1fc5},
    {0x1fd4, 0x1fd5},   {0x1fdc, 0x1fdc},   {0x1ff0, 0x1ff1},   {0x1ff5, 0x1ff5},
    {0x1fff, 0x200f},   {0x2028, 0x202f},   {0x205f, 0x206f},   {0x2072, 0x2073},
    {0x208f, 0x208f},   {0x209d, 0x209f},   {0x20c1, 0x20cf},   {0x20f1, 0x20ff},
    {0x218c, 0x218f},   {0x2427, 0x243f},   {0x244b, 0x245f},   {0x2b74, 0x2b75},
    {0x2b96, 0x2b96},   {0x2cf4, 0x2cf8},   {0x2d26, 0x2d26},   {0x2d28, 0x2d2c},
    {0x2d2e, 0x2d2f},   {0x2d68, 0x2d6e},   {0x2d71, 0x2d7e},   {0x2d97, 0x2d9f},
    {0x2da7, 0x2da7},   {0x2daf, 0x2daf},   {0x2db7, 0x2db7},   {0x2dbf, 0x2dbf},
    {0x2dc7, 0x2dc7},   {0x2dcf, 0x2dcf},   {0x2dd7, 0x2dd7},   {0x2ddf, 0x2ddf},
    {0x2e5e, 0x2e7f},   {0x2e9a, 0x2e9a},   {0x2ef4, 0x2eff},   {0x2fd6, 0x2fef},
    {0x2ffc, 0x3000},   {0x3040, 0x3040},   {0x3097, 0x3098},   {0x3100, 0x3104},
    {0x3130, 0x3130},   {0x318f, 0x318f},   {0x31e4, 0x31ef},   {0x321f, 0x321f},
    {0xa48d, 0xa48f},   {0xa4c7, 0xa4cf},   {0xa62c, 0xa63f},   {0xa6f8, 0xa6ff},
    {0xa7cb, 0xa7cf},   {0xa7d2, 0xa7d2},   {0xa7d4, 0xa7d4},   {0xa7da, 0xa7f1},
    {0xa82d, 0xa82f},   {0xa83a, 0xa83f},   {0xa878, 0xa87f},   {0xa8c6, 0xa8cd},
    {0xa8da, 0xa8df},   {0xa954, 0xa95e},   {0xa97d, 0xa97f},   {0xa9ce, 0xa9ce},
    {0xa9da, 0xa9dd},   {0xa9ff, 0xa9ff},   {0xaa37, 0xaa3f},   {0xaa4e, 0xaa4f},
    {0xaa5a, 0xaa5b},   {0xaac3, 0xaada},   {0xaaf7, 0xab00},   {0xab07, 0xab08},
    {0xab0f, 0xab10},   {0xab17, 0xab1f},   {0xab27, 0xab27},   {0xab2f, 0xab2f},
    {0xab6c, 0xab6f},   {0xabee, 0xabef},   {0xabfa, 0xabff},   {0xd7a4, 0xd7af},
    {0xd7c7, 0xd7ca},   {0xd7fc, 0xf8ff},   {0xfa6e, 0xfa6f},   {0xfada, 0xfaff},
    {0xfb07, 0xfb12},   {0xfb18, 0xfb1c},   {0xfb37, 0xfb37},   {0xfb3d, 0xfb3d},
    {0xfb3f, 0xfb3f},   {0xfb42, 0xfb42},   {0xfb45, 0xfb45},   {0xfbc3, 0xfbd2},
    {0xfd90, 0xfd91},   {0xfdc8, 0xfdce},   {0xfdd0, 0xfdef},   {0xfe1a, 0xfe1f},
    {0xfe53, 0xfe53},   {0xfe67, 0xfe67},   {0xfe6c, 0xfe6f},   {0xfe75, 0xfe75},
    {0xfefd, 0xff00},   {0xffbf, 0xffc1},   {0xffc8, 0xffc9},   {0xffd0, 0xffd1},
    {0xffd8, 0xffd9},   {0xffdd, 0xffdf},   {0xffe7, 0xffe7},   {0xffef, 0xfffb},
    {0xfffe, 0xffff},   {0x1000c, 0x1000c}, {0x10027, 0x10027}, {0x1003b, 0x1003b},
    {0x1003e, 0x1003e}, {0x1004e, 0x1004f}, {0x1005e, 0x1007f}, {0x100fb, 0x100ff},
    {0x10103, 0x10106}, {0x10134, 0x10136}, {0x1018f, 0x1018f}, {0x1019d, 0x1019f},
    {0x101a1, 0x101cf}, {0x101fe, 0x1027f}, {0x1029d, 0x1029f}, {0x102d1, 0x102df},
    {0x102fc, 0x102ff}, {0x10324, 0x1032c}, {0x1034b, 0x1034f}, {0x1037b, 0x1037f},
    {0x1039e, 0x1039e}, {0x103c4, 0x103c7}, {0x103d6, 0x103ff}, {0x1049e, 0x1049f},
    {0x104aa, 0x104af}, {0x104d4, 0x104d7}, {0x104fc, 0x104ff}, {0x10528, 0x1052f},
    {0x10564, 0x1056e}, {0x1057b, 0x1057b}, {0x1058b, 0x1058b}, {0x10593, 0x10593},
    {0x10596, 0x10596}, {0x105a2, 0x105a2}, {0x105b2, 0x105b2}, {0x105ba, 0x105ba},
    {0x105bd, 0x105ff}, {0x10737, 0x1073f}, {0x10756, 0x1075f}, {0x10768, 0x1077f},
    {0x10786, 0x10786}, {0x107b1, 0x107b1}, {0x107bb, 0x107ff}, {0x10806, 0x10807},
    {0x10809, 0x10809}, {0x10836, 0x10836}, {0x10839, 0x1083b}, {0x1083d, 0x1083e},
    {0x10856, 0x10856}, {0x1089f, 0x108a6}, {0x108b0, 0x108df}, {0x108f3, 0x108f3},
    {0x108f6, 0x108fa}, {0x1091c, 0x1091e}, {0x1093a, 0x1093e}, {0x10940, 0x1097f},
    {0x109b8, 0x109bb}, {0x109d0, 0x109d1}, {0x10a04, 0x10a04}, {0x10a07, 0x10a0b},
    {0x10a14, 0x10a14}, {0x10a18, 0x10a18}, {0x10a36, 0x10a37}, {0x10a3b, 0x10a3e},
    {0x10a49, 0x10a4f}, {0x10a59, 0x10a5f}, {0x10aa0, 0x10abf}, {0x10ae7, 0x10aea},
    {0x10af7, 0x10aff}, {0x10b36, 0x10b38}, {0x10b56, 0x10b57}, {0x10b73, 0x10b77},
    {0x10b92, 0x10b98}, {0x10b9d, 0x10ba8}, {0x10bb0, 0x10bff}, {0x10c49, 0x10c7f},
    {0x10cb3, 0x10cbf}, {0x10cf3, 0x10cf9}, {0x10d28, 0x10d2f}, {0x10d3a, 0x10e5f},
    {0x10e7f, 0x10e7f}, {0x10eaa, 0x10eaa}, {0x10eae, 0x10eaf}, {0x10eb2, 0x10eff},
    {0x10f28, 0x10f2f}, {0x10f5a, 0x10f6f}, {0x10f8a, 0x10faf}, {0x10fcc, 0x10fdf},
    {0x10ff7, 0x10fff}, {0x1104e, 0x11051}, {0x11076, 0x1107e}, {0x110bd, 0x110bd},
    {0x110c3, 0x110cf}, {0x110e9, 0x110ef}, {0x110fa, 0x110ff}, {0x11135, 0x11135},
    {0x11148, 0x1114f}, {0x11177, 0x1117f}, {0x111e0, 0x111e0}, {0x111f5, 0x111ff},
    {0x11212, 0x11212}, {0x1123f, 0x1127f}, {0x11287, 0x11287}, {0x11289, 0x11289},
    {0x1128e, 0x1128e}, {0x1129e, 0x1129e}, {0x112aa, 0x112af}, {0x112eb, 0x112ef},
    {0x112fa, 0x112ff}, {0x11304, 0x11304}, {0x1130d, 0x1130e}, {0x11311, 0x11312},
    {0x11329, 0x11329}, {0x11331, 0x11331}, {0x11334, 0x11334}, {0x1133a, 0x1133a},
    {0x11345, 0x11346}, {0x11349, 0x1134a}, {0x1134e, 0x1134f}, {0x11351, 0x11356},
    {0x11358, 0x1135c}, {0x11364, 0x11365}, {0x1136d, 0x1136f}, {0x11375, 0x113ff},
    {0x1145c, 0x1145c}, {0x11462, 0x1147f}, {0x114c8, 0x114cf}, {0x114da, 0x1157f},
    {0x115b6, 0x115b7}, {0x115de, 0x115ff}, {0x11645, 0x1164f}, {0x1165a, 0x1165f},
    {0x1166d, 0x1167f}, {0x116ba, 0x116bf}, {0x116ca, 0x116ff}, {0x1171b, 0x1171c},
    {0x1172c, 0x1172f}, {0x11747, 0x117ff}, {0x1183c, 0x1189f}, {0x118f3, 0x118fe},
    {0x11907, 0x11908}, {0x1190a, 0x1190b}, {0x11914, 0x11914}, {0x11917, 0x11917},
    {0x11936, 0x11936}, {0x11939, 0x1193a}, {0x11947, 0x1194f}, {0x1195a, 0x1199f},
    {0x119a8, 0x119a9}, {0x119d8, 0x119d9}, {0x119e5, 0x119ff}, {0x11a48, 0x11a4f},
    {0x11aa3, 0x11aaf}, {0x11af9, 0x11bff}, {0x11c09, 0x11c09}, {0x11c37, 0x11c37},
    {0x11c46, 0x11c4f}, {0x11c6d, 0x11c6f}, {0x11c90, 0x11c91}, {0x11ca8, 0x11ca8},
    {0x11cb7, 0x11cff}, {0x11d07, 0x11d07}, {0x11d0a, 0x11d0a}, {0x11d37, 0x11d39},
    {0x11d3b, 0x11d3b}, {0x11d3e, 0x11d3e}, {0x11d48, 0x11d4f}, {0x11d5a, 0x11d5f},
    {0x11d66, 0x11d66}, {0x11d69, 0x11d69}, {0x11d8f, 0x11d8f}, {0x11d92, 0x11d92},
    {0x11d99, 0x11d9f}, {0x11daa, 0x11edf}, {0x11ef9, 0x11faf}, {0x11fb1, 0x11fbf},
    {0x11ff2, 0x11ffe}, {0x1239a, 0x123ff}, {0x1246f, 0x1246f}, {0x12475, 0x1247f},
    {0x12544, 0x12f8f}, {0x12ff3, 0x12fff}, {0x1342f, 0x143ff}, {0x14647, 0x167ff},
    {0x16a39, 0x16a3f}, {0x16a5f, 0x16a5f}, {0x16a6a, 0x16a6d}, {0x16abf, 0x16abf},
    {0x16aca, 0x16acf}, {0x16aee, 0x16aef}, {0x16af6, 0x16aff}, {0x16b46, 0x16b4f},
    {0x16b5a, 0x16b5a}, {0x16b62, 0x16b62}, {0x16b78, 0x16b7c}, {0x16b90, 0x16e3f},
    {0x16e9b, 0x16eff}, {0x16f4b, 0x16f4e}, {0x16f88, 0x16f8e}, {0x16fa0, 0x16fdf},
    {0x16fe5, 0x16fef}, {0x16ff2, 0x16fff}, {0x187f8, 0x187ff}, {0x18cd6, 0x18cff},
    {0x18d09, 0x1afef}, {0x1aff4, 0x1aff4}, {0x1affc, 0x1affc}, {0x1afff, 0x1afff},
    {0x1b123, 0x1b14f}, {0x1b153, 0x1b163}, {0x1b168, 0x1b16f}, {0x1b2fc, 0x1bbff},
    {0x1bc6b, 0x1bc6f}, {0x1bc7d, 0x1bc7f}, {0x1bc89, 0x1bc8f}, {0x1bc9a, 0x1bc9b},
    {0x1bca0, 0x1ceff}, {0x1cf2e, 0x1cf2f}, {0x1cf47, 0x1cf4f}, {0x1cfc4, 0x1cfff},
    {0x1d0f6, 0x1d0ff}, {0x1d127, 0x1d128}, {0x1d173, 0x1d17a}, {0x1d1eb, 0x1d1ff},
    {0x1d246, 0x1d2df}, {0x1d2f4, 0x1d2ff}, {0x1d357, 0x1d35f}, {0x1d379, 0x1d3ff},
    {0x1d455, 0x1d455}, {0x1d49d, 0x1d49d}, {0x1d4a0, 0x1d4a1}, {0x1d4a3, 0x1d4a4},
    {0x1d4a7, 0x1d4a8}, {0x1d4ad, 0x1d4ad}, {0x1d4ba, 0x1d4ba}, {0x1d4bc, 0x1d4bc},
    {0x1d4c4, 0x1d4c4}, {0x1d506, 0x1d506}, {0x1d50b, 0x1d50c}, {0x1d515, 0x1d515},
    {0x1d51d, 0x1d51d}, {0x1d53a, 0x1d53a}, {0x1d53f, 0x1d53f}, {0x1d545, 0x1d545},
    {0x1d547, 0x1d549}, {0x1d551, 0x1d551}, {0x1d6a6, 0x1d6a7}, {0x1d7cc, 0x1d7cd},
    {0x1da8c, 0x1da9a}, {0x1daa0, 0x1daa0}, {0x1dab0, 0x1deff}, {0x1df1f, 0x1dfff},
    {0x1e007, 0x1e007}, {0x1e019, 0x1e01a}, {0x1e022, 0x1e022}, {0x1e025, 0x1e025},
    {0x1e02b, 0x1e0ff}, {0x1e12d, 0x1e12f}, {0x1e13e, 0x1e13f}, {0x1e14a, 0x1e14d},
    {0x1e150, 0x1e28f}, {0x1e2af, 0x1e2bf}, {0x1e2fa, 0x1e2fe}, {0x1e300, 0x1e7df},
    {0x1e7e7, 0x1e7e7}, {0x1e7ec, 0x1e7ec}, {0x1e7ef, 0x1e7ef}, {0x1e7ff, 0x1e7ff},
    {0x1e8c5, 0x1e8c6}, {0x1e8d7, 0x1e8ff}, {0x1e94c, 0x1e94f}, {0x1e95a, 0x1e95d},
    {0x1e960, 0x1ec70}, {0x1ecb5, 0x1ed00}, {0x1ed3e, 0x1edff}, {0x1ee04, 0x1ee04},
    {0x1ee20, 0x1ee20}, {0x1ee23, 0x1ee23}, {0x1ee25, 0x1ee26}, {0x1ee28, 0x1ee28},
    {0x1ee33, 0x1ee33}, {0x1ee38, 0x1ee38}, {0x1ee3a, 0x1ee3a}, {0x1ee3c, 0x1ee41},
    {0x1ee43, 0x1ee46}, {0x1ee48, 0x1ee48}, {0x1ee4a, 0x1ee4a}, {0x1ee4c, 0x1ee4c},
    {0x1ee50, 0x1ee50}, {0x1ee53, 0x1ee53}, {0x1ee55, 0x1ee56}, {0x1ee58, 0x1ee58},
    {0x1ee5a, 0x1ee5a}, {0x1ee5c, 0x1ee5c}, {0x1ee5e, 0x1ee5e}, {0x1ee60, 0x1ee60},
    {0x1ee63, 0x1ee63}, {0x1ee65, 0x1ee66}, {0x1ee6b, 0x1ee6b}, {0x1ee73, 0x1ee73},
    {0x1ee78, 0x1ee78}, {0x1ee7d, 0x1ee7d}, {0x1ee7f, 0x1ee7f}, {0x1ee8a, 0x1ee8a},
    {0x1ee9c, 0x1eea0}, {0x1eea4, 0x1eea4}, {0x1eeaa, 0x1eeaa}, {0x1eebc, 0x1eeef},
    {0x1eef2, 0x1efff}, {0x1f02c, 0x1f02f}, {0x1f094, 0x1f09f}, {0x1f0af, 0x1f0b0},
    {0x1f0c0, 0x1f0c0}, {0x1f0d0, 0x1f0d0}, {0x1f0f6, 0x1f0ff}, {0x1f1ae, 0x1f1e5},
    {0x1f203, 0x1f20f}, {0x1f23c, 0x1f23f}, {0x1f249, 0x1f24f}, {0x1f252, 0x1f25f},
    {0x1f266, 0x1f2ff}, {0x1f6d8, 0x1f6dc}, {0x1f6ed, 0x1f6ef}, {0x1f6fd, 0x1f6ff},
    {0x1f774, 0x1f77f}, {0x1f7d9, 0x1f7df}, {0x1f7ec, 0x1f7ef}, {0x1f7f1, 0x1f7ff},
    {0x1f80c, 0x1f80f}, {0x1f848, 0x1f84f}, {0x1f85a, 0x1f85f}, {0x1f888, 0x1f88f},
    {0x1f8ae, 0x1f8af}, {0x1f8b2, 0x1f8ff}, {0x1fa54, 0x1fa5f}, {0x1fa6e, 0x1fa6f},
    {0x1fa75, 0x1fa77}, {0x1fa7d, 0x1fa7f}, {0x1fa87, 0x1fa8f}, {0x1faad, 0x1faaf},
    {0x1fabb, 0x1fabf}, {0x1fac6, 0x1facf}, {0x1fada, 0x1fadf}, {0x1fae8, 0x1faef},
    {0x1faf7, 0x1faff}, {0x1fb93, 0x1fb93}, {0x1fbcb, 0x1fbef}, {0x1fbfa, 0x1ffff},
    {0x2a6e0, 0x2a6ff}, {0x2b739, 0x2b73f}, {0x2b81e, 0x2b81f}, {0x2cea2, 0x2ceaf},
    {0x2ebe1, 0x2f7ff}, {0x2fa1e, 0x2ffff}, {0x3134b, 0xe00ff}, {0xe01f0, 0x10ffff}};

static int is_printable(uint32_t cp)
{
    size_t lo = 0, hi = sizeof(nonprint) / sizeof(nonprint[0]);
    if (cp < 0x80)
        return cp >= 0x20 && cp < 0x7f;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < nonprint[mid][0])
            hi = mid;
        else if (cp > nonprint[mid][1])
            lo = mid + 1;
        else
            return 0;
    }
    return 1;
}

size_t py_utf8_next(const char *s, size_t len, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned char lo = 0x80, hi = 0xBF;
    size_t n;
    uint32_t v;

    if (len == 0)
        return 0;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] >= 0xC2 && u[0] <= 0xDF) {
        n = 2;
        v = u[0] & 0x1F;
    } else if (u[0] >= 0xE0 && u[0] <= 0xEF) {
        n = 3;
        v = u[0] & 0x0F;
        if (u[0] == 0xE0)
            lo = 0xA0; /* overlong */
        else if (u[0] == 0xED)
            hi = 0x9F; /* UTF-16 surrogates */
    } else if (u[0] >= 0xF0 && u[0] <= 0xF4) {
        n = 4;
        v = u[0] & 0x07;
        if (u[0] == 0xF0)
            lo = 0x90; /* overlong */
        else if (u[0] == 0xF4)
            hi = 0x8F; /* above U+10FFFF */
    } else {
        return 0;
    }
    if (len < n || u[1] < lo || u[1] > hi)
        return 0;
    v = (v << 6) | (u[1] & 0x3F);
    for (size_t i = 2; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = v;
    return n;
}

/* ======================================================================== */
/* Numbers                                                                  */
/* ======================================================================== */

/* Integral doubles print as Python ints unless they were floats on the wire. */
static int is_int_number(const cJSON *v)
{
    double d = v->valuedouble;
    return !(v->type & PY_JSON_FLOAT) && isfinite(d) && floor(d) == d;
}

static int put_int_number(struct buf *out, double d)
{
    if (d == 0) /* "-0" parses to -0.0, but Python's int has no negative zero */
        return buf_putc(out, '0');
    return buf_printf(out, "%.0f", d);
}

/* Python's float repr: the shortest digit string that reads back as the same
 * double, in fixed notation when the decimal exponent is in [-4, 16), else in
 * exponent notation with at least two exponent digits. snprintf("%e") and
 * strtod() find the digits; only the digits and exponent are taken from their
 * output, so whatever decimal point the locale uses does not leak out. */
static int put_float(struct buf *out, double d, int json)
{
    char tmp[64], dig[24];
    int nd = 0, exp10 = 0, rc;
    const char *e;

    if (isnan(d))
        return buf_puts(out, json ? "NaN" : "nan");
    if (isinf(d))
        return buf_puts(out, d < 0 ? (json ? "-Infinity" : "-inf")
                                   : (json ? "Infinity" : "inf"));
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d)
            break;
    }
    for (const char *p = tmp; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < (int)sizeof(dig) - 1)
            dig[nd++] = *p;
    e = strchr(tmp, 'e');
    if (e)
        exp10 = (int)strtol(e + 1, NULL, 10);
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    dig[nd] = '\0';

    if (signbit(d) && (rc = buf_putc(out, '-')))
        return rc;
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            rc = buf_puts(out, "0.");
            for (int i = 0; !rc && i < -exp10 - 1; i++)
                rc = buf_putc(out, '0');
            return rc ? rc : buf_puts(out, dig);
        }
        /* integer part: digits 0..exp10, padded with zeros */
        for (int i = 0; i <= exp10; i++)
            if ((rc = buf_putc(out, i < nd ? dig[i] : '0')))
                return rc;
        if ((rc = buf_putc(out, '.')))
            return rc;
        return nd > exp10 + 1 ? buf_puts(out, dig + exp10 + 1) : buf_putc(out, '0');
    }
    if ((rc = buf_putc(out, dig[0])))
        return rc;
    if (nd > 1 && ((rc = buf_putc(out, '.')) || (rc = buf_puts(out, dig + 1))))
        return rc;
    return buf_printf(out, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
}

static int put_number(struct buf *out, const cJSON *v, int json)
{
    if (is_int_number(v))
        return put_int_number(out, v->valuedouble);
    return put_float(out, v->valuedouble, json);
}

cJSON *py_json_float(double v)
{
    cJSON *n = cJSON_CreateNumber(v);
    if (n)
        n->type |= PY_JSON_FLOAT;
    return n;
}

/* ======================================================================== */
/* json.dumps()                                                             */
/* ======================================================================== */

int py_json_string(struct buf *out, const char *s)
{
    size_t len = strlen(s), i = 0;
    int rc = buf_putc(out, '"');
    while (!rc && i < len) {
        uint32_t cp;
        size_t n = py_utf8_next(s + i, len - i, &cp);
        if (n == 0) {
            cp = 0xFFFD;
            n = 1;
        }
        i += n;
        switch (cp) {
        case '"':
            rc = buf_puts(out, "\\\"");
            break;
        case '\\':
            rc = buf_puts(out, "\\\\");
            break;
        case '\n':
            rc = buf_puts(out, "\\n");
            break;
        case '\r':
            rc = buf_puts(out, "\\r");
            break;
        case '\t':
            rc = buf_puts(out, "\\t");
            break;
        case '\b':
            rc = buf_puts(out, "\\b");
            break;
        case '\f':
            rc = buf_puts(out, "\\f");
            break;
        default:
            if (cp >= 0x20 && cp < 0x7f)
                rc = buf_putc(out, (char)cp);
            else if (cp < 0x10000)
                rc = buf_printf(out, "\\u%04x", (unsigned)cp);
            else
                rc = buf_printf(out, "\\u%04x\\u%04x",
                                (unsigned)(0xD800 + ((cp - 0x10000) >> 10)),
                                (unsigned)(0xDC00 + ((cp - 0x10000) & 0x3FF)));
        }
    }
    return rc ? rc : buf_putc(out, '"');
}

int py_json_dumps(const cJSON *v, struct buf *out)
{
    const cJSON *c;
    int rc = 0;

    if (!v)
        return buf_puts(out, "null");
    switch (v->type & 0xFF) {
    case cJSON_False:
        return buf_puts(out, "false");
    case cJSON_True:
        return buf_puts(out, "true");
    case cJSON_Number:
        return put_number(out, v, 1);
    case cJSON_String:
        return py_json_string(out, v->valuestring ? v->valuestring : "");
    case cJSON_Raw:
        return buf_puts(out, v->valuestring ? v->valuestring : "null");
    case cJSON_Array:
        rc = buf_putc(out, '[');
        for (c = v->child; !rc && c; c = c->next) {
            if (c != v->child)
                rc = buf_puts(out, ", ");
            if (!rc)
                rc = py_json_dumps(c, out);
        }
        return rc ? rc : buf_putc(out, ']');
    case cJSON_Object:
        rc = buf_putc(out, '{');
        for (c = v->child; !rc && c; c = c->next) {
            if (c != v->child)
                rc = buf_puts(out, ", ");
            if (!rc)
                rc = py_json_string(out, c->string ? c->string : "");
            if (!rc)
                rc = buf_puts(out, ": ");
            if (!rc)
                rc = py_json_dumps(c, out);
        }
        return rc ? rc : buf_putc(out, '}');
    default: /* cJSON_NULL and cJSON_Invalid */
        return buf_puts(out, "null");
    }
}

/* ======================================================================== */
/* repr()                                                                   */
/* ======================================================================== */

/* Output with a soft limit: rendering stops as soon as more than limit bytes
 * exist, so a 10 MB argument costs no more than a short one. */
struct rctx {
    struct buf *b;
    size_t limit; /* 0 = none */
};

#define REPR_FULL 1 /* internal: limit reached, stop rendering */

static int rcheck(struct rctx *r, int rc)
{
    if (rc)
        return rc;
    return r->limit && r->b->len > r->limit ? REPR_FULL : 0;
}

static int repr_string(struct rctx *r, const char *s)
{
    size_t len = strlen(s), i = 0;
    char q = '\'';
    int rc;

    if (memchr(s, '\'', len) && !memchr(s, '"', len))
        q = '"';
    if ((rc = rcheck(r, buf_putc(r->b, q))))
        return rc;
    while (i < len) {
        uint32_t cp;
        size_t n = py_utf8_next(s + i, len - i, &cp), rawlen = n;
        const char *raw = s + i;
        if (n == 0) {
            raw = "\xEF\xBF\xBD"; /* U+FFFD for a byte Python could not hold */
            rawlen = 3;
            cp = 0xFFFD;
            n = 1;
        }
        i += n;
        if (cp == (uint32_t)q || cp == '\\')
            rc = buf_printf(r->b, "\\%c", (char)cp);
        else if (cp == '\t')
            rc = buf_puts(r->b, "\\t");
        else if (cp == '\n')
            rc = buf_puts(r->b, "\\n");
        else if (cp == '\r')
            rc = buf_puts(r->b, "\\r");
        else if (cp < 0x80 && is_printable(cp))
            rc = buf_putc(r->b, (char)cp);
        else if (is_printable(cp))
            rc = buf_append(r->b, raw, rawlen);
        else if (cp < 0x100)
            rc = buf_printf(r->b, "\\x%02x", (unsigned)cp);
        else if (cp < 0x10000)
            rc = buf_printf(r->b, "\\u%04x", (unsigned)cp);
        else
            rc = buf_printf(r->b, "\\U%08x", (unsigned)cp);
        if ((rc = rcheck(r, rc)))
            return rc;
    }
    return rcheck(r, buf_putc(r->b, q));
}

static int repr_value(struct rctx *r, const cJSON *v, int depth)
{
    const cJSON *c;
    int rc;

    if (!v)
        return rcheck(r, buf_puts(r->b, "None"));
    if (depth > 1000) /* Python would raise RecursionError; keep the stack safe */
        return rcheck(r, buf_puts(r->b, "..."));
    switch (v->type & 0xFF) {
    case cJSON_False:
        return rcheck(r, buf_puts(r->b, "False"));
    case cJSON_True:
        return rcheck(r, buf_puts(r->b, "True"));
    case cJSON_Number:
        return rcheck(r, put_number(r->b, v, 0));
    case cJSON_String:
        return repr_string(r, v->valuestring ? v->valuestring : "");
    case cJSON_Raw:
        return rcheck(r, buf_puts(r->b, v->valuestring ? v->valuestring : "None"));
    case cJSON_Array:
    case cJSON_Object: {
        int obj = (v->type & 0xFF) == cJSON_Object;
        if ((rc = rcheck(r, buf_putc(r->b, obj ? '{' : '['))))
            return rc;
        for (c = v->child; c; c = c->next) {
            if (c != v->child && (rc = rcheck(r, buf_puts(r->b, ", "))))
                return rc;
            if (obj && ((rc = repr_string(r, c->string ? c->string : "")) ||
                        (rc = rcheck(r, buf_puts(r->b, ": ")))))
                return rc;
            if ((rc = repr_value(r, c, depth + 1)))
                return rc;
        }
        return rcheck(r, buf_putc(r->b, obj ? '}' : ']'));
    }
    default:
        return rcheck(r, buf_puts(r->b, "None"));
    }
}

int py_repr(const cJSON *v, struct buf *out, size_t max_bytes)
{
    struct buf tmp;
    struct rctx r;
    size_t keep;
    int rc;

    buf_init(&tmp);
    r.b = &tmp;
    r.limit = max_bytes;
    rc = repr_value(&r, v, 0);
    if (rc < 0) {
        buf_release(&tmp);
        return rc;
    }
    if (rc != REPR_FULL) {
        rc = buf_append(out, tmp.data, tmp.len);
        buf_release(&tmp);
        return rc;
    }
    /* Cut back to the start of a UTF-8 sequence so no character is split. */
    keep = max_bytes;
    while (keep > 0 && ((unsigned char)tmp.data[keep] & 0xC0) == 0x80)
        keep--;
    rc = buf_reserve(out, keep + 3);
    if (!rc) {
        buf_append(out, tmp.data, keep);
        buf_puts(out, "...");
    }
    buf_release(&tmp);
    return rc;
}

/* ======================================================================== */
/* Strict JSON scanning                                                     */
/* ======================================================================== */

/* One scanner for every strict reading of JSON text: py_json_parse() runs it
 * over the whole text before cJSON sees it, and the OpenAI chunk fast path
 * (protocol/openai.c) walks the objects it knows with it. Nothing here
 * allocates; recursion is bounded by PY_JSON_MAX_DEPTH. */

static int fail(struct py_json_scan *sc, const char *why)
{
    if (!sc->why)
        sc->why = why;
    return -1;
}

void py_json_scan_init(struct py_json_scan *sc, const char *text, size_t len)
{
    sc->s = text;
    sc->len = len;
    sc->pos = 0;
    sc->depth = 0;
    sc->nonfinite = 0;
    sc->why = NULL;
}

void py_json_skip_ws(struct py_json_scan *sc)
{
    while (sc->pos < sc->len && (sc->s[sc->pos] == ' ' || sc->s[sc->pos] == '\t' ||
                                 sc->s[sc->pos] == '\n' || sc->s[sc->pos] == '\r'))
        sc->pos++;
}

static int hex4(struct py_json_scan *sc, uint32_t *v)
{
    *v = 0;
    if (sc->len - sc->pos < 4)
        return fail(sc, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        int d = cr_hexval(sc->s[sc->pos++]);
        if (d < 0)
            return fail(sc, "bad \\u escape");
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

static size_t utf8_len(uint32_t cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* 1 for a byte that stands for itself in a string: printable ASCII but the
 * quote and the backslash. Scanning a plain run costs one look-up per byte,
 * which matters on the OpenAI fast path (every streamed token). */
/* clang-format off */
static const unsigned char plain[256] = {
    /* 0x00-0x1F: control characters */
    0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,
    /* 0x20-0x3F: '"' is 0x22 */
    1,1,0,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,
    /* 0x40-0x5F: '\\' is 0x5C */
    1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,0,1,1,1,
    /* 0x60-0x7F */
    1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,
    /* 0x80-0xFF: UTF-8, checked a sequence at a time */
};
/* clang-format on */

int py_json_scan_string(struct py_json_scan *sc, struct py_json_str *out)
{
    const unsigned char *s = (const unsigned char *)sc->s;
    size_t i = sc->pos, n = sc->len, shrink = 0; /* escapes: bytes saved decoding */

    if (i >= n || s[i] != '"')
        return fail(sc, "expected string");
    out->p = sc->s + ++i;
    for (;;) {
        unsigned char c;
        while (i < n && plain[s[i]])
            i++;
        if (i >= n) {
            sc->pos = i;
            return fail(sc, "unterminated string");
        }
        c = s[i];
        if (c == '"') {
            out->raw = (size_t)(sc->s + i - out->p);
            out->len = out->raw - shrink;
            sc->pos = i + 1;
            return 0;
        }
        if (c == '\\') {
            uint32_t cp, lo;
            sc->pos = i + 1;
            if (sc->pos >= n)
                return fail(sc, "unterminated string");
            c = s[sc->pos++];
            if (strchr("\"\\/bfnrt", c) && c) {
                shrink += 1;
                i = sc->pos;
                continue;
            }
            if (c != 'u')
                return fail(sc, "bad escape");
            if (hex4(sc, &cp))
                return -1;
            if (cp == 0)
                return fail(sc, "\\u0000 in string");
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return fail(sc, "lone low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (n - sc->pos < 2 || s[sc->pos] != '\\' || s[sc->pos + 1] != 'u')
                    return fail(sc, "lone high surrogate");
                sc->pos += 2;
                if (hex4(sc, &lo))
                    return -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return fail(sc, "lone high surrogate");
                cp = 0x10000;
            }
            shrink += (cp >= 0x10000 ? 12 : 6) - utf8_len(cp);
            i = sc->pos;
            continue;
        }
        if (c < 0x80) {
            sc->pos = i;
            return fail(sc, "control character in string");
        }
        {
            uint32_t cp;
            size_t k = py_utf8_next(sc->s + i, n - i, &cp);
            if (k == 0) {
                sc->pos = i;
                return fail(sc, "invalid UTF-8");
            }
            i += k;
        }
    }
}

static int is_digit(const struct py_json_scan *sc)
{
    return sc->pos < sc->len && sc->s[sc->pos] >= '0' && sc->s[sc->pos] <= '9';
}

int py_json_scan_number(struct py_json_scan *sc)
{
    size_t start = sc->pos;
    if (sc->pos < sc->len && sc->s[sc->pos] == '-')
        sc->pos++;
    if (!is_digit(sc))
        return fail(sc, "bad number");
    if (sc->s[sc->pos] == '0')
        sc->pos++;
    else
        while (is_digit(sc))
            sc->pos++;
    if (sc->pos < sc->len && sc->s[sc->pos] == '.') {
        sc->pos++;
        if (!is_digit(sc))
            return fail(sc, "bad number");
        while (is_digit(sc))
            sc->pos++;
    }
    if (sc->pos < sc->len && (sc->s[sc->pos] == 'e' || sc->s[sc->pos] == 'E')) {
        sc->pos++;
        if (sc->pos < sc->len && (sc->s[sc->pos] == '+' || sc->s[sc->pos] == '-'))
            sc->pos++;
        if (!is_digit(sc))
            return fail(sc, "bad number");
        while (is_digit(sc))
            sc->pos++;
    }
    /* cJSON copies a number into a 64-byte buffer and stops there. */
    if (sc->pos - start > PY_JSON_MAX_NUMBER)
        return fail(sc, "number too long");
    return 0;
}

int py_json_scan_literal(struct py_json_scan *sc, const char *lit)
{
    size_t n = strlen(lit);
    if (sc->len - sc->pos < n || memcmp(sc->s + sc->pos, lit, n) != 0)
        return fail(sc, "bad literal");
    sc->pos += n;
    return 0;
}

/* After a member or element: a ',' (returns 1, more follow) or the closing
 * byte (returns 0, the container is done). */
static int next_or_close(struct py_json_scan *sc, char close)
{
    py_json_skip_ws(sc);
    if (sc->pos >= sc->len)
        return fail(sc, "unexpected end");
    if (sc->s[sc->pos] == ',') {
        sc->pos++;
        return 1;
    }
    if (sc->s[sc->pos] != close)
        return fail(sc, "expected ',' or end of container");
    sc->pos++;
    sc->depth--;
    return 0;
}

/* Enters the container at sc->pos: returns 1 when it holds something, 0 when
 * it was empty (and is already closed), -1 when nested too deep. */
static int open_container(struct py_json_scan *sc, char open, char close)
{
    if (sc->pos >= sc->len || sc->s[sc->pos] != open)
        return fail(sc, open == '{' ? "expected object" : "expected array");
    if (++sc->depth > PY_JSON_MAX_DEPTH)
        return fail(sc, "nested too deep");
    sc->pos++;
    py_json_skip_ws(sc);
    if (sc->pos < sc->len && sc->s[sc->pos] == close) {
        sc->pos++;
        sc->depth--;
        return 0;
    }
    return 1;
}

int py_json_scan_object(struct py_json_scan *sc, py_json_member_fn *member,
                        void *privdata)
{
    int rc = open_container(sc, '{', '}');

    while (rc > 0) {
        struct py_json_str key;
        py_json_skip_ws(sc);
        if (sc->pos >= sc->len || sc->s[sc->pos] != '"')
            return fail(sc, "expected key");
        if (py_json_scan_string(sc, &key))
            return -1;
        py_json_skip_ws(sc);
        if (sc->pos >= sc->len || sc->s[sc->pos] != ':')
            return fail(sc, "expected ':'");
        sc->pos++;
        py_json_skip_ws(sc);
        if (member(sc, &key, privdata))
            return fail(sc, "value refused");
        rc = next_or_close(sc, '}');
    }
    return rc;
}

int py_json_scan_array(struct py_json_scan *sc, py_json_element_fn *element,
                       void *privdata)
{
    int rc = open_container(sc, '[', ']');
    size_t index = 0;

    while (rc > 0) {
        py_json_skip_ws(sc);
        if (element(sc, index++, privdata))
            return fail(sc, "value refused");
        rc = next_or_close(sc, ']');
    }
    return rc;
}

static int any_member(struct py_json_scan *sc, const struct py_json_str *key,
                      void *privdata)
{
    (void)key;
    (void)privdata;
    return py_json_scan_value(sc);
}

static int any_element(struct py_json_scan *sc, size_t index, void *privdata)
{
    (void)index;
    (void)privdata;
    return py_json_scan_value(sc);
}

int py_json_scan_value(struct py_json_scan *sc)
{
    struct py_json_str ignored;
    char c;

    py_json_skip_ws(sc);
    if (sc->pos >= sc->len)
        return fail(sc, "unexpected end");
    c = sc->s[sc->pos];
    switch (c) {
    case '{':
        return py_json_scan_object(sc, any_member, NULL);
    case '[':
        return py_json_scan_array(sc, any_element, NULL);
    case '"':
        return py_json_scan_string(sc, &ignored);
    case 't':
        return py_json_scan_literal(sc, "true");
    case 'f':
        return py_json_scan_literal(sc, "false");
    case 'n':
        return py_json_scan_literal(sc, "null");
    case 'N':
        sc->nonfinite = 1;
        return py_json_scan_literal(sc, "NaN");
    case 'I':
        sc->nonfinite = 1;
        return py_json_scan_literal(sc, "Infinity");
    default:
        if (c == '-' && sc->pos + 1 < sc->len && sc->s[sc->pos + 1] == 'I') {
            sc->nonfinite = 1;
            return py_json_scan_literal(sc, "-Infinity");
        }
        if (c == '-' || (c >= '0' && c <= '9'))
            return py_json_scan_number(sc);
        return fail(sc, "unexpected character");
    }
}

int py_json_scan_text(struct py_json_scan *sc)
{
    if (py_json_scan_value(sc))
        return -1;
    py_json_skip_ws(sc);
    if (sc->pos != sc->len)
        return fail(sc, "trailing data");
    return 0;
}

static char *put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        *out++ = (char)cp;
    } else if (cp < 0x800) {
        *out++ = (char)(0xC0 | cp >> 6);
        *out++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *out++ = (char)(0xE0 | cp >> 12);
        *out++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *out++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *out++ = (char)(0xF0 | cp >> 18);
        *out++ = (char)(0x80 | (cp >> 12 & 0x3F));
        *out++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *out++ = (char)(0x80 | (cp & 0x3F));
    }
    return out;
}

/* The four hex digits at p, which py_json_scan_string() has checked. */
static uint32_t hex4_at(const char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v = v << 4 | (uint32_t)cr_hexval(p[i]);
    return v;
}

void py_json_unescape(const struct py_json_str *s, char *out)
{
    const char *p = s->p, *end = s->p + s->raw;

    if (s->raw == s->len) {
        memcpy(out, p, s->len);
        return;
    }
    while (p < end) {
        uint32_t cp;
        if (*p != '\\') {
            *out++ = *p++;
            continue;
        }
        switch (p[1]) {
        case 'u':
            cp = hex4_at(p + 2);
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                cp = 0x10000 + ((cp & 0x3FF) << 10 | (hex4_at(p + 2) & 0x3FF));
                p += 6;
            }
            out = put_utf8(out, cp);
            continue;
        case 'b':
            *out++ = '\b';
            break;
        case 'f':
            *out++ = '\f';
            break;
        case 'n':
            *out++ = '\n';
            break;
        case 'r':
            *out++ = '\r';
            break;
        case 't':
            *out++ = '\t';
            break;
        default: /* " \ / */
            *out++ = p[1];
        }
        p += 2;
    }
}

/* ======================================================================== */
/* Strict JSON parsing                                                      */
/* ======================================================================== */

/* Finds the next number token (NaN and [-]Infinity included) at or after *pos,
 * skipping strings; returns its start and sets *pos past it. */
static size_t next_number(const char *s, size_t len, size_t *pos)
{
    size_t i = *pos, start;
    while (i < len) {
        char c = s[i];
        if (c == '"') {
            for (i++; i < len && s[i] != '"'; i++)
                if (s[i] == '\\')
                    i++;
            i++;
        } else if (c == '-' || c == 'N' || c == 'I' || (c >= '0' && c <= '9')) {
            start = i;
            while (i < len && s[i] && strchr("0123456789+-.eEINaNfinity", s[i]))
                i++;
            *pos = i;
            return start;
        } else {
            i++;
        }
    }
    *pos = i;
    return len;
}

/* cJSON keeps members in document order, so a pre-order walk meets the numbers
 * in the same order as a left-to-right scan of the original text. Numbers with
 * a fraction or exponent get PY_JSON_FLOAT; NaN and Infinity (parsed by cJSON
 * from placeholders, see below) get their real value here. */
static void mark_numbers(cJSON *v, const char *s, size_t len, size_t *pos)
{
    if (cJSON_IsNumber(v)) {
        size_t start = next_number(s, len, pos), n = *pos - start;
        const char *tok = s + start;
        if (memchr(tok, 'N', n) || memchr(tok, 'I', n)) {
            /* set by hand: cJSON_SetNumberValue() would convert NaN to int */
            v->valuedouble = tok[0] == 'N' ? NAN : tok[0] == '-' ? -INFINITY : INFINITY;
            v->valueint = 0;
            v->type |= PY_JSON_FLOAT;
        } else if (memchr(tok, '.', n) || memchr(tok, 'e', n) || memchr(tok, 'E', n)) {
            v->type |= PY_JSON_FLOAT;
        }
        return;
    }
    for (cJSON *c = v->child; c; c = c->next)
        mark_numbers(c, s, len, pos);
}

/* Returns a copy of text in which NaN, Infinity and -Infinity outside strings
 * are replaced by numbers of the same length, which cJSON can parse. */
static char *placeholders(const char *text, size_t len)
{
    char *copy = cr_malloc(len + 1);
    size_t pos = 0;
    if (!copy)
        return NULL;
    memcpy(copy, text, len);
    copy[len] = '\0';
    while (pos < len) {
        size_t start = next_number(text, len, &pos), n = pos - start;
        if (start < len &&
            (memchr(text + start, 'N', n) || memchr(text + start, 'I', n))) {
            size_t sign = text[start] == '-'; /* "-Infinity" keeps its '-' */
            memset(copy + start + sign, '0', n - sign);
        }
    }
    return copy;
}

int py_json_parse(const char *text, size_t len, cJSON **out, struct cr_err *err)
{
    struct py_json_scan sc;
    size_t pos = 0;
    char *copy = NULL;
    cJSON *root;

    *out = NULL;
    if (!text)
        return cr_err_set(err, CR_EDECODE, "no JSON text");
    py_json_scan_init(&sc, text, len);
    if (py_json_scan_text(&sc))
        return cr_err_set(err, CR_EDECODE, "bad JSON at byte %zu: %s", sc.pos, sc.why);
    /* The text is known to be valid, so the only way left for cJSON to fail is
     * running out of memory. The length-bounded call never reads past len. */
    if (sc.nonfinite && !(copy = placeholders(text, len)))
        return cr_err_set(err, CR_ENOMEM, "out of memory parsing JSON");
    root = cJSON_ParseWithLengthOpts(copy ? copy : text, len, NULL, 0);
    cr_free(copy);
    if (!root)
        return cr_err_set(err, CR_ENOMEM, "out of memory parsing JSON");
    mark_numbers(root, text, len, &pos);
    *out = root;
    return 0;
}
