/* fmt.c -- fixture: not formatted as .clang-format says (rule "format"). */
int  answer(void){return 42;}
