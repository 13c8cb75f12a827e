/* gw_page.c -- the web page (gateway/page.html), embedded in the binary at
 * build time so that nothing is read from disk at run time.
 *
 * The assembler's .incbin copies the file verbatim; a NUL follows it so it can
 * also be used as a C string. The Makefile makes this object depend on the
 * page. The path is relative to the top of the tree, where make runs. */

__asm__(".section .rodata\n"
        ".global gw_page_html\n"
        ".type gw_page_html, @object\n"
        ".balign 16\n"
        "gw_page_html:\n"
        ".incbin \"gateway/page.html\"\n"
        ".byte 0\n"
        ".global gw_page_html_end\n"
        ".type gw_page_html_end, @object\n"
        "gw_page_html_end:\n"
        ".previous\n");
