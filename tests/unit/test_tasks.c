/* test_tasks.c -- the built-in tasks' argument binding (engine/tasks.h), against what
 * Python would do with the same signatures:
 *
 *   llm.generate(prompt, model=None, system=None, template=None, **params)
 *   llm.chat(messages, model=None, **params)
 *   llm.embed(input, model=None)
 *   celery.accumulate(*args, **kwargs)   (Celery's own: args[kwargs.get('index')])
 *
 * The Python messages were taken from CPython 3.11 calling functions with those
 * signatures. Where celeriac binds differently today, a vector pins what celeriac does
 * (the integration suite depends on it, and this issue changes no behaviour) and its
 * `python` field says what Python would have said: those are marked NEEDSWORK. Python
 * names a function by its qualname ("generate()"); celeriac uses the task name
 * ("llm.generate()"), which is not counted as a difference. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tasks.h"
#include "protocol/celery_msg.h"
#include "util/alloc.h"
#include "util/err.h"

#define GEN_DEFAULT "gen-default"
#define EMB_DEFAULT "emb-default"
/* What every streamed chat request ends with. */
#define STREAM ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}"
#define USER(text) "[{\"role\":\"user\",\"content\":\"" text "\"}]"
#define CHAT_MSGS "[{\"role\":\"user\",\"content\":\"hi\"}]"

static cJSON *json(const char *text)
{
    cJSON *j = cJSON_Parse(text);
    ck_assert_msg(j != NULL, "bad JSON in the test: %s", text);
    return j;
}

/* Binds args/kwargs (JSON text) for kind, as the worker does after decoding. */
static int build(enum task_kind kind, const char *args, const char *kwargs,
                 struct task_call *c, struct task_error *te)
{
    struct task_msg m;
    int rc;
    task_msg_init(&m);
    m.args = json(args);
    m.kwargs = json(kwargs);
    memset(te, 0, sizeof(*te));
    rc = tasks_build_call(kind, &m, GEN_DEFAULT, EMB_DEFAULT, c, te);
    task_msg_release(&m);
    return rc;
}

/* "TypeError: message" for an error, or the exact request body on success. */
static void check_outcome(const char *what, int rc, const struct task_call *c,
                          const struct task_error *te, int want_rc, const char *want)
{
    char got[512];
    ck_assert_msg(rc == want_rc, "%s: rc %d, want %d (%s: %s)", what, rc, want_rc,
                  te->exc_type, te->message);
    if (rc == 0) {
        ck_assert_msg(c->body != NULL && c->body_len == strlen(c->body),
                      "%s: body and body_len disagree", what);
        ck_assert_msg(!strcmp(c->body, want), "%s:\n got %s\nwant %s", what, c->body,
                      want);
    } else {
        snprintf(got, sizeof(got), "%s: %s", te->exc_type, te->message);
        ck_assert_msg(!strcmp(got, want), "%s:\n got %s\nwant %s", what, got, want);
        ck_assert_msg(c->body == NULL, "%s: a body on error", what);
    }
}

/* ------------------------------------------------------------ lookup */

START_TEST(test_lookup)
{
    /* writable copies: the API takes char *const * (argv-style) */
    char a0[] = "my.gen=llm.generate", a1[] = "x=llm.chat", a2[] = "xy=llm.embed",
         a3[] = "gone=no.such.task", a4[] = "acc=celery.accumulate",
         a5[] = "llm.chat=llm.embed";
    char *aliases[] = {a0, a1, a2, a3, a4}, *shadow[] = {a5};
    ck_assert_int_eq(tasks_lookup("llm.generate", NULL, 0), TASK_GENERATE);
    ck_assert_int_eq(tasks_lookup("llm.chat", NULL, 0), TASK_CHAT);
    ck_assert_int_eq(tasks_lookup("llm.embed", NULL, 0), TASK_EMBED);
    ck_assert_int_eq(tasks_lookup("celery.accumulate", NULL, 0), TASK_ACCUMULATE);
    ck_assert_int_eq(tasks_lookup("llm.gen", NULL, 0), TASK_UNKNOWN);
    ck_assert_int_eq(tasks_lookup("llm.generatex", NULL, 0), TASK_UNKNOWN);
    ck_assert_int_eq(tasks_lookup("LLM.GENERATE", NULL, 0), TASK_UNKNOWN);
    ck_assert_int_eq(tasks_lookup("", NULL, 0), TASK_UNKNOWN);
    ck_assert_int_eq(tasks_lookup("my.gen", aliases, 5), TASK_GENERATE);
    ck_assert_int_eq(tasks_lookup("x", aliases, 5), TASK_CHAT);
    /* "x" is a prefix of "xy": each alias is matched whole */
    ck_assert_int_eq(tasks_lookup("xy", aliases, 5), TASK_EMBED);
    ck_assert_int_eq(tasks_lookup("acc", aliases, 5), TASK_ACCUMULATE);
    /* an alias of an unknown task, or of an alias, is unknown */
    ck_assert_int_eq(tasks_lookup("gone", aliases, 5), TASK_UNKNOWN);
    ck_assert_int_eq(tasks_lookup("my", aliases, 5), TASK_UNKNOWN);
    ck_assert_int_eq(tasks_lookup("my.gen", aliases, 0), TASK_UNKNOWN);
    /* a built-in name wins over an alias of the same name */
    ck_assert_int_eq(tasks_lookup("llm.chat", shadow, 1), TASK_CHAT);
}
END_TEST

START_TEST(test_builtin_names)
{
    int n = 0;
    for (; tasks_builtin_names[n]; n++) {
        ck_assert_int_ne(tasks_lookup(tasks_builtin_names[n], NULL, 0), TASK_UNKNOWN);
        if (n)
            ck_assert_int_lt(strcmp(tasks_builtin_names[n - 1], tasks_builtin_names[n]),
                             0);
    }
    ck_assert_int_eq(n, 7);
}
END_TEST

/* ------------------------------------------------------------ binding vectors */

static const struct vec {
    const char *what;
    enum task_kind kind;
    const char *args, *kwargs;
    int rc;            /* 0 or CR_EINVAL */
    const char *want;  /* the request body, or "ExcType: message" */
    const char *model; /* rc 0: the model the call names */
    int embed_list;
    const char *python; /* NEEDSWORK: what Python says where celeriac differs */
} vecs[] = {
    /* llm.generate(prompt, model=None, system=None, template=None, **params) */
    {"generate positional", TASK_GENERATE, "[\"hi\"]", "{}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("hi") STREAM, GEN_DEFAULT},
    {"generate keyword", TASK_GENERATE, "[]", "{\"prompt\":\"hi\"}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("hi") STREAM, GEN_DEFAULT},
    {"generate model positional", TASK_GENERATE, "[\"hi\",\"m1\"]", "{}", 0,
     "{\"model\":\"m1\",\"messages\":" USER("hi") STREAM, "m1"},
    {"generate model keyword", TASK_GENERATE, "[\"hi\"]", "{\"model\":\"m2\"}", 0,
     "{\"model\":\"m2\",\"messages\":" USER("hi") STREAM, "m2"},
    {"generate model None is the default", TASK_GENERATE, "[\"hi\",null]", "{}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("hi") STREAM, GEN_DEFAULT},
    {"generate system positional", TASK_GENERATE, "[\"hi\",null,\"be brief\"]", "{}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":[{\"role\":\"system\",\"content\":\"be "
     "brief\"},{\"role\":\"user\",\"content\":\"hi\"}]" STREAM,
     GEN_DEFAULT},
    {"generate system keyword", TASK_GENERATE, "[\"hi\"]",
     "{\"system\":\"s\",\"model\":\"m\"}", 0,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":"
     "\"user\",\"content\":\"hi\"}]" STREAM,
     "m"},
    {"generate all four positional", TASK_GENERATE, "[\"x\",\"m\",\"s\",\"<{input}>\"]",
     "{}", 0,
     "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":"
     "\"user\",\"content\":\"<x>\"}]" STREAM,
     "m"},
    {"generate template, every placeholder", TASK_GENERATE, "[\"x\"]",
     "{\"template\":\"Q: {input} / {input}!\"}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("Q: x / x!") STREAM,
     GEN_DEFAULT},
    {"generate template None", TASK_GENERATE, "[\"x\"]", "{\"template\":null}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("x") STREAM, GEN_DEFAULT},
    {"generate params pass through, in order", TASK_GENERATE, "[\"hi\"]",
     "{\"temperature\":0.5,\"max_tokens\":5,\"stop\":[\"\\n\"]}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER(
         "hi") ",\"temperature\":0.5,\"max_tokens\":5,\"stop\":[\"\\n\"]" STREAM,
     GEN_DEFAULT},
    {"generate drops stream, stream_options, messages", TASK_GENERATE, "[\"hi\"]",
     "{\"stream\":true,\"stream_options\":{},\"messages\":[],\"n\":1}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("hi") ",\"n\":1" STREAM,
     GEN_DEFAULT},
    {"stream=False asks for one whole answer", TASK_GENERATE, "[\"hi\"]",
     "{\"stream\":false}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("hi") ",\"stream\":false}",
     GEN_DEFAULT},
    {"retry_invalid_json is the worker's, not sent", TASK_CHAT, "[" CHAT_MSGS "]",
     "{\"retry_invalid_json\":true}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" CHAT_MSGS STREAM, GEN_DEFAULT},
    {"generate empty prompt", TASK_GENERATE, "[\"\"]", "{}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("") STREAM, GEN_DEFAULT},
    {"generate list prompt joined", TASK_GENERATE, "[[\"a\",1,{\"k\":\"v\"},null,[2]]]",
     "{}", 0,
     "{\"model\":\"" GEN_DEFAULT
     "\",\"messages\":" USER("a\\n1\\n{\\\"k\\\":\\\"v\\\"}\\nnull\\n[2]") STREAM,
     GEN_DEFAULT},
    {"generate empty list prompt", TASK_GENERATE, "[[]]", "{}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("") STREAM, GEN_DEFAULT},
    {"generate list prompt with template", TASK_GENERATE, "[[\"a\",\"b\"]]",
     "{\"template\":\"[{input}]\"}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("[a\\nb]") STREAM, GEN_DEFAULT},
    {"generate unicode prompt", TASK_GENERATE, "[\"h\\u00e9\\u2603\"]", "{}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("h\xc3\xa9\xe2\x98\x83") STREAM,
     GEN_DEFAULT},
    {"generate missing prompt", TASK_GENERATE, "[]", "{}", CR_EINVAL,
     "TypeError: llm.generate() missing 1 required positional argument: 'prompt'"},
    {"generate missing prompt, other keywords", TASK_GENERATE, "[]",
     "{\"model\":\"m\",\"temperature\":1}", CR_EINVAL,
     "TypeError: llm.generate() missing 1 required positional argument: 'prompt'"},
    {"generate prompt twice", TASK_GENERATE, "[\"hi\"]", "{\"prompt\":\"x\"}", CR_EINVAL,
     "TypeError: llm.generate() got multiple values for argument 'prompt'"},
    {"generate model twice", TASK_GENERATE, "[\"hi\",\"m\"]", "{\"model\":\"n\"}",
     CR_EINVAL, "TypeError: llm.generate() got multiple values for argument 'model'"},
    {"generate too many positionals", TASK_GENERATE, "[\"a\",\"b\",\"c\",\"d\",\"e\"]",
     "{}", CR_EINVAL,
     "TypeError: llm.generate() takes from 1 to 4 positional arguments but 5 were given"},
    /* CPython reports keyword errors before counting positionals. */
    {"generate too many positionals and a keyword twice", TASK_GENERATE,
     "[\"a\",\"b\",\"c\",\"d\",\"e\"]", "{\"prompt\":\"x\"}", CR_EINVAL,
     "TypeError: llm.generate() takes from 1 to 4 positional arguments but 5 were given",
     NULL, 0, "TypeError: generate() got multiple values for argument 'prompt'"},
    {"generate prompt a number", TASK_GENERATE, "[5]", "{}", CR_EINVAL,
     "TypeError: llm.generate() argument 'prompt' must be a string or a list"},
    {"generate prompt None", TASK_GENERATE, "[null]", "{}", CR_EINVAL,
     "TypeError: llm.generate() argument 'prompt' must be a string or a list"},
    {"generate prompt a dict", TASK_GENERATE, "[]", "{\"prompt\":{\"a\":1}}", CR_EINVAL,
     "TypeError: llm.generate() argument 'prompt' must be a string or a list"},
    {"generate model a number", TASK_GENERATE, "[\"hi\"]", "{\"model\":5}", CR_EINVAL,
     "TypeError: llm.generate() argument 'model' must be a string"},
    {"generate system a list", TASK_GENERATE, "[\"hi\",null,[\"s\"]]", "{}", CR_EINVAL,
     "TypeError: llm.generate() argument 'system' must be a string"},
    {"generate template a bool", TASK_GENERATE, "[\"hi\"]", "{\"template\":true}",
     CR_EINVAL, "TypeError: llm.generate() argument 'template' must be a string"},
    {"generate template without placeholder", TASK_GENERATE, "[\"hi\"]",
     "{\"template\":\"no placeholder\"}", CR_EINVAL,
     "ValueError: template has no {input} placeholder"},
    {"generate template with a broken placeholder", TASK_GENERATE, "[\"hi\"]",
     "{\"template\":\"{inpu} {INPUT}\"}", CR_EINVAL,
     "ValueError: template has no {input} placeholder"},

    /* llm.chat(messages, model=None, **params) */
    {"chat positional", TASK_CHAT, "[" CHAT_MSGS "]", "{}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" CHAT_MSGS STREAM, GEN_DEFAULT},
    {"chat keyword", TASK_CHAT, "[]", "{\"messages\":" CHAT_MSGS "}", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" CHAT_MSGS STREAM, GEN_DEFAULT},
    {"chat model positional", TASK_CHAT, "[" CHAT_MSGS ",\"m\"]", "{}", 0,
     "{\"model\":\"m\",\"messages\":" CHAT_MSGS STREAM, "m"},
    {"chat model keyword, params", TASK_CHAT, "[" CHAT_MSGS "]",
     "{\"model\":\"m\",\"temperature\":0,\"stream\":true}", 0,
     "{\"model\":\"m\",\"messages\":" CHAT_MSGS ",\"temperature\":0" STREAM, "m"},
    {"chat messages kept whole", TASK_CHAT,
     "[[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{"
     "\"type\":"
     "\"text\",\"text\":\"hi\"}],\"name\":\"u\"},{\"role\":\"assistant\"}]]",
     "{}", 0,
     "{\"model\":\"" GEN_DEFAULT
     "\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}],\"name\":"
     "\"u\"},"
     "{\"role\":\"assistant\"}]" STREAM,
     GEN_DEFAULT},
    {"chat missing messages", TASK_CHAT, "[]", "{\"model\":\"m\"}", CR_EINVAL,
     "TypeError: llm.chat() missing 1 required positional argument: 'messages'"},
    {"chat messages twice", TASK_CHAT, "[" CHAT_MSGS "]", "{\"messages\":" CHAT_MSGS "}",
     CR_EINVAL, "TypeError: llm.chat() got multiple values for argument 'messages'"},
    {"chat model twice", TASK_CHAT, "[" CHAT_MSGS ",\"m\"]", "{\"model\":\"n\"}",
     CR_EINVAL, "TypeError: llm.chat() got multiple values for argument 'model'"},
    {"chat too many positionals", TASK_CHAT, "[" CHAT_MSGS ",\"m\",3]", "{}", CR_EINVAL,
     "TypeError: llm.chat() takes from 1 to 2 positional arguments but 3 were given"},
    {"chat messages a string", TASK_CHAT, "[\"hi\"]", "{}", CR_EINVAL,
     "TypeError: llm.chat() argument 'messages' must be a non-empty list of {'role', "
     "'content'} dicts"},
    {"chat messages empty", TASK_CHAT, "[[]]", "{}", CR_EINVAL,
     "TypeError: llm.chat() argument 'messages' must be a non-empty list of {'role', "
     "'content'} dicts"},
    {"chat messages None", TASK_CHAT, "[null]", "{}", CR_EINVAL,
     "TypeError: llm.chat() argument 'messages' must be a non-empty list of {'role', "
     "'content'} dicts"},
    {"chat message not a dict", TASK_CHAT,
     "[["
     "\"hi\""
     "]]",
     "{}", CR_EINVAL, "ValueError: llm.chat() each message needs a string 'role'"},
    {"chat message without role", TASK_CHAT, "[[{\"content\":\"hi\"}]]", "{}", CR_EINVAL,
     "ValueError: llm.chat() each message needs a string 'role'"},
    {"chat message role a number", TASK_CHAT,
     "[[" CHAT_MSGS ",{\"role\":1,\"content\":\"x\"}]]", "{}", CR_EINVAL,
     "ValueError: llm.chat() each message needs a string 'role'"},
    {"chat model a list", TASK_CHAT, "[" CHAT_MSGS ",[\"m\"]]", "{}", CR_EINVAL,
     "TypeError: llm.chat() argument 'model' must be a string"},

    /* llm.embed(input, model=None) */
    {"embed positional", TASK_EMBED, "[\"x\"]", "{}", 0,
     "{\"model\":\"" EMB_DEFAULT "\",\"input\":\"x\",\"encoding_format\":\"float\"}",
     EMB_DEFAULT},
    {"embed keyword", TASK_EMBED, "[]", "{\"input\":\"x\"}", 0,
     "{\"model\":\"" EMB_DEFAULT "\",\"input\":\"x\",\"encoding_format\":\"float\"}",
     EMB_DEFAULT},
    {"embed a list", TASK_EMBED, "[[\"a\",\"b\"]]", "{}", 0,
     "{\"model\":\"" EMB_DEFAULT
     "\",\"input\":[\"a\",\"b\"],\"encoding_format\":\"float\"}",
     EMB_DEFAULT, 1},
    {"embed an empty list", TASK_EMBED, "[[]]", "{}", 0,
     "{\"model\":\"" EMB_DEFAULT "\",\"input\":[],\"encoding_format\":\"float\"}",
     EMB_DEFAULT, 1},
    {"embed model positional", TASK_EMBED, "[\"x\",\"e\"]", "{}", 0,
     "{\"model\":\"e\",\"input\":\"x\",\"encoding_format\":\"float\"}", "e"},
    {"embed model keyword", TASK_EMBED, "[\"x\"]", "{\"model\":\"e\"}", 0,
     "{\"model\":\"e\",\"input\":\"x\",\"encoding_format\":\"float\"}", "e"},
    {"embed model None", TASK_EMBED, "[\"x\"]", "{\"model\":null}", 0,
     "{\"model\":\"" EMB_DEFAULT "\",\"input\":\"x\",\"encoding_format\":\"float\"}",
     EMB_DEFAULT},
    {"embed unknown keyword", TASK_EMBED, "[\"x\"]", "{\"dimensions\":3}", CR_EINVAL,
     "TypeError: llm.embed() got an unexpected keyword argument 'dimensions'"},
    {"embed encoding_format is not a parameter", TASK_EMBED, "[\"x\"]",
     "{\"encoding_format\":\"base64\"}", CR_EINVAL,
     "TypeError: llm.embed() got an unexpected keyword argument 'encoding_format'"},
    {"embed missing input", TASK_EMBED, "[]", "{}", CR_EINVAL,
     "TypeError: llm.embed() missing 1 required positional argument: 'input'"},
    {"embed missing input and an unknown keyword", TASK_EMBED, "[]", "{\"foo\":1}",
     CR_EINVAL, "TypeError: llm.embed() missing 1 required positional argument: 'input'",
     NULL, 0, "TypeError: embed() got an unexpected keyword argument 'foo'"},
    {"embed input twice", TASK_EMBED, "[\"x\"]", "{\"input\":\"y\"}", CR_EINVAL,
     "TypeError: llm.embed() got multiple values for argument 'input'"},
    {"embed too many positionals", TASK_EMBED, "[\"x\",\"e\",\"z\"]", "{}", CR_EINVAL,
     "TypeError: llm.embed() takes from 1 to 2 positional arguments but 3 were given"},
    {"embed too many positionals and an unknown keyword", TASK_EMBED,
     "[\"x\",\"e\",\"z\"]", "{\"foo\":1}", CR_EINVAL,
     "TypeError: llm.embed() takes from 1 to 2 positional arguments but 3 were given",
     NULL, 0, "TypeError: embed() got an unexpected keyword argument 'foo'"},
    {"embed input a number", TASK_EMBED, "[5]", "{}", CR_EINVAL,
     "TypeError: llm.embed() argument 'input' must be a string or a list of strings"},
    {"embed input a list with a number", TASK_EMBED, "[[\"a\",1]]", "{}", CR_EINVAL,
     "TypeError: llm.embed() argument 'input' must be a string or a list of strings"},
    {"embed input None", TASK_EMBED, "[null]", "{}", CR_EINVAL,
     "TypeError: llm.embed() argument 'input' must be a string or a list of strings"},
    {"embed model a number", TASK_EMBED, "[\"x\",1]", "{}", CR_EINVAL,
     "TypeError: llm.embed() argument 'model' must be a string"},

    /* Kinds that do not call an LLM. */
    {"accumulate builds no call", TASK_ACCUMULATE, "[1]", "{}", CR_EINVAL,
     "TypeError: task does not call an LLM"},
    {"unknown builds no call", TASK_UNKNOWN, "[]", "{}", CR_EINVAL,
     "TypeError: task does not call an LLM"},
};

/* Whether a chat passes tools, read from the request (the router sends such
 * a chat down the provider path, which keeps the tool calls). */
START_TEST(test_tools_flag)
{
    struct task_call c;
    struct task_error te;

    ck_assert_int_eq(
        build(TASK_CHAT, "[[{\"role\":\"user\",\"content\":\"say \\\"tools\\\"\"}]]",
              "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", &c,
              &te),
        0);
    ck_assert_int_eq(c.tools, 1);
    task_call_release(&c);
    ck_assert_int_eq(build(TASK_CHAT,
                           "[[{\"role\":\"user\",\"content\":\"say \\\"tools\\\"\"}]]",
                           "{}", &c, &te),
                     0);
    ck_assert_int_eq(c.tools, 0);
    task_call_release(&c);
    ck_assert_int_eq(build(TASK_GENERATE, "[\"hi\"]", "{\"Tools\":1}", &c, &te), 0);
    ck_assert_int_eq(c.tools, 0);
    task_call_release(&c);
}
END_TEST

START_TEST(test_binding)
{
    const struct vec *v = &vecs[_i];
    struct task_call c;
    struct task_error te;
    int rc = build(v->kind, v->args, v->kwargs, &c, &te);
    check_outcome(v->what, rc, &c, &te, v->rc, v->want);
    if (rc == 0) {
        ck_assert_int_eq(c.op, v->kind == TASK_EMBED ? LLM_OP_EMBED : LLM_OP_CHAT);
        ck_assert_str_eq(c.model, v->model);
        ck_assert_int_eq(c.embed_list, v->embed_list);
    }
    task_call_release(&c);
    ck_assert_ptr_null(c.body);
}
END_TEST

/* ------------------------------------------------------------ celery.accumulate */

static const struct acc {
    const char *what, *args, *kwargs;
    const char *want;   /* the return value as JSON, or "ExcType: message" */
    const char *python; /* NEEDSWORK: what Celery's accumulate returns or raises */
} accs[] = {
    {"no index: the whole tuple", "[1,2,3]", "{}", "[1,2,3]"},
    {"no arguments", "[]", "{}", "[]"},
    {"index None", "[1,2,3]", "{\"index\":null}", "[1,2,3]"},
    {"index 0", "[1,2,3]", "{\"index\":0}", "1"},
    {"index last", "[1,2,{\"a\":[1]}]", "{\"index\":2}", "{\"a\":[1]}"},
    {"index -1", "[1,2,3]", "{\"index\":-1}", "3"},
    {"index -3", "[1,2,3]", "{\"index\":-3}", "1"},
    {"index past the end", "[1,2,3]", "{\"index\":3}",
     "IndexError: tuple index out of range"},
    {"index before the start", "[1,2,3]", "{\"index\":-4}",
     "IndexError: tuple index out of range"},
    {"index into nothing", "[]", "{\"index\":0}", "IndexError: tuple index out of range"},
    {"index a string", "[1,2,3]", "{\"index\":\"0\"}",
     "TypeError: tuple indices must be integers or slices, not str"},
    {"index a float", "[1,2,3]", "{\"index\":1.5}", "2",
     "TypeError: tuple indices must be integers or slices, not float"},
    {"index True", "[1,2,3]", "{\"index\":true}",
     "TypeError: tuple indices must be integers or slices, not object", "2"},
    {"index a list", "[1,2,3]", "{\"index\":[0]}",
     "TypeError: tuple indices must be integers or slices, not object",
     "TypeError: tuple indices must be integers or slices, not list"},
    {"index a dict", "[1,2,3]", "{\"index\":{}}",
     "TypeError: tuple indices must be integers or slices, not object",
     "TypeError: tuple indices must be integers or slices, not dict"},
    {"an unknown keyword", "[1,2,3]", "{\"foo\":1}",
     "TypeError: accumulate() got an unexpected keyword argument 'foo'", "[1,2,3]"},
    {"an unknown keyword after index", "[1,2,3]", "{\"index\":0,\"foo\":1}",
     "TypeError: accumulate() got an unexpected keyword argument 'foo'", "1"},
};

START_TEST(test_accumulate)
{
    const struct acc *a = &accs[_i];
    struct task_msg m;
    struct task_error te;
    char got[512];
    cJSON *r;

    task_msg_init(&m);
    m.args = json(a->args);
    m.kwargs = json(a->kwargs);
    memset(&te, 0, sizeof(te));
    r = tasks_accumulate(&m, &te);
    if (r) {
        char *s = cJSON_PrintUnformatted(r);
        snprintf(got, sizeof(got), "%s", s);
        cr_free(s);
        cJSON_Delete(r);
    } else {
        ck_assert_msg(te.exc_type[0] != '\0', "%s: NULL without an error", a->what);
        snprintf(got, sizeof(got), "%s: %s", te.exc_type, te.message);
    }
    ck_assert_msg(!strcmp(got, a->want), "%s:\n got %s\nwant %s", a->what, got, a->want);
    task_msg_release(&m);
}
END_TEST

/* The result is a copy: the message can go while the result lives on. */
START_TEST(test_accumulate_copies)
{
    struct task_msg m;
    struct task_error te;
    cJSON *whole, *one;
    char *s;

    task_msg_init(&m);
    m.args = json("[{\"a\":\"b\"},[1,2]]");
    m.kwargs = json("{}");
    whole = tasks_accumulate(&m, &te);
    cJSON_Delete(m.kwargs);
    m.kwargs = json("{\"index\":1}");
    one = tasks_accumulate(&m, &te);
    task_msg_release(&m);
    ck_assert(whole && one);
    s = cJSON_PrintUnformatted(whole);
    ck_assert_str_eq(s, "[{\"a\":\"b\"},[1,2]]");
    cr_free(s);
    s = cJSON_PrintUnformatted(one);
    ck_assert_str_eq(s, "[1,2]");
    cr_free(s);
    cJSON_Delete(whole);
    cJSON_Delete(one);
}
END_TEST

/* ------------------------------------------------------------ whole messages */

/* What the worker does: decode the message as it arrived, look the task up, bind. */
static int from_message(const char *headers, const char *body, struct task_msg *m,
                        struct task_call *c, struct task_error *te)
{
    struct celery_raw_msg raw;
    struct cr_err err = {0, ""};
    cJSON *h = headers ? json(headers) : NULL;
    int rc;

    memset(&raw, 0, sizeof(raw));
    raw.content_type = "application/json";
    raw.content_encoding = "utf-8";
    raw.headers = h;
    raw.body = body;
    raw.body_len = strlen(body);
    task_msg_init(m);
    rc = celery_msg_decode(&raw, m, &err);
    cJSON_Delete(h);
    ck_assert_msg(rc == 0, "decode: %d %s", rc, err.msg);
    memset(te, 0, sizeof(*te));
    return tasks_build_call(tasks_lookup(m->task, NULL, 0), m, GEN_DEFAULT, EMB_DEFAULT,
                            c, te);
}

#define V2_HEADERS(task)                                                                 \
    "{\"lang\":\"py\",\"task\":\"" task                                                  \
    "\",\"id\":\"id-1\",\"shadow\":null,\"eta\":null,"                                   \
    "\"expires\":null,\"group\":null,\"group_index\":null,\"retries\":0,"                \
    "\"timelimit\":[null,null],\"root_id\":\"id-1\",\"parent_id\":null,"                 \
    "\"argsrepr\":\"('hi',)\",\"kwargsrepr\":\"{}\",\"origin\":\"gen1@host\","           \
    "\"ignore_result\":false}"
#define V2_EMBED                                                                         \
    "{\"callbacks\": null, \"errbacks\": null, \"chain\": null, \"chord\": null}"

static const struct whole {
    const char *what, *headers, *body;
    int rc;
    const char *want;   /* the request body, or "ExcType: message" */
    const char *python; /* NEEDSWORK: what a Python worker would bind */
} wholes[] = {
    /* As Celery 5 sends apply_async(("hi",), {"model": "m", "max_tokens": 8}). */
    {"v2 generate", V2_HEADERS("llm.generate"),
     "[[\"hi\"], {\"model\": \"m\", \"max_tokens\": 8}, " V2_EMBED "]", 0,
     "{\"model\":\"m\",\"messages\":" USER("hi") ",\"max_tokens\":8" STREAM},
    /* Python's json.loads keeps the last of duplicate keys; the decoder keeps both in
     * kwargs. */
    {"v2 duplicate keyword", V2_HEADERS("llm.generate"),
     "[[\"hi\"], {\"model\": \"a\", \"model\": \"b\"}, null]", CR_EINVAL,
     "TypeError: llm.generate() got multiple values for argument 'model'",
     "{\"model\":\"b\",\"messages\":" USER("hi") STREAM},
    {"v2 duplicate parameter", V2_HEADERS("llm.generate"),
     "[[\"hi\"], {\"top_k\": 1, \"top_k\": 2}, null]", 0,
     "{\"model\":\"" GEN_DEFAULT
     "\",\"messages\":" USER("hi") ",\"top_k\":1,\"top_k\":2" STREAM,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" USER("hi") ",\"top_k\":2" STREAM},
    {"v2 chat", V2_HEADERS("llm.chat"),
     "[[], {\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}, " V2_EMBED "]", 0,
     "{\"model\":\"" GEN_DEFAULT "\",\"messages\":" CHAT_MSGS STREAM},
    {"v2 embed", V2_HEADERS("llm.embed"), "[[[\"a\", \"b\"]], {}, null]", 0,
     "{\"model\":\"" EMB_DEFAULT
     "\",\"input\":[\"a\",\"b\"],\"encoding_format\":\"float\"}"},
    /* The decoder accepts Python's NaN; cJSON writes it into the request as null
     * (a Python worker's json.dumps would send NaN, which is not JSON). */
    {"v2 generate NaN parameter", V2_HEADERS("llm.generate"),
     "[[\"hi\"], {\"temperature\": NaN}, null]", 0,
     "{\"model\":\"" GEN_DEFAULT
     "\",\"messages\":" USER("hi") ",\"temperature\":null" STREAM},
    {"v2 embed unexpected keyword", V2_HEADERS("llm.embed"),
     "[[\"a\"], {\"user\": \"u\"}, null]", CR_EINVAL,
     "TypeError: llm.embed() got an unexpected keyword argument 'user'"},
    {"v2 generate without arguments", V2_HEADERS("llm.generate"), "[[], {}, null]",
     CR_EINVAL,
     "TypeError: llm.generate() missing 1 required positional argument: 'prompt'"},
    /* Protocol 1: everything in a body dict. */
    {"v1 generate", NULL,
     "{\"task\": \"llm.generate\", \"id\": \"id-1\", \"args\": [\"hi\"], "
     "\"kwargs\": {\"system\": \"s\"}}",
     0,
     "{\"model\":\"" GEN_DEFAULT
     "\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
     "{\"role\":\"user\",\"content\":\"hi\"}]" STREAM},
    {"v1 without args or kwargs", NULL, "{\"task\": \"llm.chat\", \"id\": \"id-1\"}",
     CR_EINVAL,
     "TypeError: llm.chat() missing 1 required positional argument: 'messages'"},
};

START_TEST(test_whole_message)
{
    const struct whole *w = &wholes[_i];
    struct task_msg m;
    struct task_call c;
    struct task_error te;
    int rc = from_message(w->headers, w->body, &m, &c, &te);
    check_outcome(w->what, rc, &c, &te, w->rc, w->want);
    task_call_release(&c);
    task_msg_release(&m);
}
END_TEST

/* ------------------------------------------------------------ malformed and limits */

/* An error message is cut to fit, never overflows, and stays a C string. */
START_TEST(test_long_names_truncate)
{
    struct task_call c;
    struct task_error te;
    char kwargs[4200];
    int rc;

    memset(kwargs, 'k', sizeof(kwargs));
    memcpy(kwargs, "{\"", 2);
    memcpy(kwargs + sizeof(kwargs) - 6, "\":1}", 5);
    rc = build(TASK_EMBED, "[\"x\"]", kwargs, &c, &te);
    ck_assert_int_eq(rc, CR_EINVAL);
    ck_assert_str_eq(te.exc_type, "TypeError");
    ck_assert_uint_eq(strlen(te.message), sizeof(te.message) - 1);
    ck_assert(
        !strncmp(te.message, "llm.embed() got an unexpected keyword argument 'kkk", 51));
    task_call_release(&c);
}
END_TEST

/* A very long model name is cut in the call's model field; the body keeps it whole. */
START_TEST(test_long_model)
{
    struct task_call c;
    struct task_error te;
    char kwargs[600], model[500];
    int rc;

    memset(model, 'm', sizeof(model) - 1);
    model[sizeof(model) - 1] = '\0';
    snprintf(kwargs, sizeof(kwargs), "{\"model\":\"%s\"}", model);
    rc = build(TASK_GENERATE, "[\"hi\"]", kwargs, &c, &te);
    ck_assert_int_eq(rc, 0);
    ck_assert_uint_eq(strlen(c.model), sizeof(c.model) - 1);
    ck_assert(!strncmp(c.model, model, sizeof(c.model) - 1));
    ck_assert_ptr_nonnull(strstr(c.body, model));
    task_call_release(&c);
}
END_TEST

/* Many positionals, a long list prompt and a deep value in the parameters. */
START_TEST(test_big_inputs)
{
    struct task_call c;
    struct task_error te;
    struct buf b;
    int rc;

    buf_init(&b);
    ck_assert_int_eq(buf_putc(&b, '['), 0);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(buf_puts(&b, i ? ",\"a\"" : "\"a\""), 0);
    ck_assert_int_eq(buf_putc(&b, ']'), 0);
    rc = build(TASK_GENERATE, b.data, "{}", &c, &te);
    ck_assert_int_eq(rc, CR_EINVAL);
    ck_assert_str_eq(te.message, "llm.generate() takes from 1 to 4 positional arguments "
                                 "but 1000 were given");
    task_call_release(&c);

    /* the same 1,000 strings as one list prompt: joined by newlines */
    buf_reset(&b);
    ck_assert_int_eq(buf_puts(&b, "[["), 0);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(buf_puts(&b, i ? ",\"a\"" : "\"a\""), 0);
    ck_assert_int_eq(buf_puts(&b, "]]"), 0);
    rc = build(TASK_GENERATE, b.data, "{\"n\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}", &c,
               &te);
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(strstr(c.body, "\"content\":\"a\\na\\na\\n"));
    ck_assert_ptr_nonnull(strstr(c.body, ",\"n\":[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]"));
    task_call_release(&c);
    buf_release(&b);
}
END_TEST

/* The binding reads the message and never changes it. */
START_TEST(test_message_untouched)
{
    static const char *args = "[\"p\",\"m\"]", *kwargs = "{\"system\":\"s\",\"x\":[1]}";
    struct task_msg m;
    struct task_call c;
    struct task_error te;
    char *a, *k;

    task_msg_init(&m);
    m.args = json(args);
    m.kwargs = json(kwargs);
    ck_assert_int_eq(
        tasks_build_call(TASK_GENERATE, &m, GEN_DEFAULT, EMB_DEFAULT, &c, &te), 0);
    task_call_release(&c);
    a = cJSON_PrintUnformatted(m.args);
    k = cJSON_PrintUnformatted(m.kwargs);
    ck_assert_str_eq(a, args);
    ck_assert_str_eq(k, kwargs);
    cr_free(a);
    cr_free(k);
    task_msg_release(&m);
}
END_TEST

/* ------------------------------------------------------------ allocation failures */

/* Every allocation inside the binding fails in turn, until the call gets through: each
 * failure gives CR_ENOMEM and no body, the success the same body as without failures,
 * and nothing leaks (LeakSanitizer under make asan, each test in its own child). */
static const struct oom {
    enum task_kind kind;
    const char *args, *kwargs;
} ooms[] = {
    {TASK_GENERATE, "[[\"a\",1,{\"k\":2}]]",
     "{\"system\":\"s\",\"template\":\"<{input}>\"}"},
    {TASK_GENERATE, "[\"hi\",\"m\"]", "{}"},
    /* These three once found that a failed cJSON_AddItemToObject (its key copy)
     * dropped the item from the request and leaked it. */
    {TASK_GENERATE, "[\"hi\"]", "{\"temperature\":0.5,\"stop\":[\"x\"]}"},
    {TASK_CHAT, "[" CHAT_MSGS ",\"m\"]", "{\"max_tokens\":3}"},
    {TASK_EMBED, "[[\"a\",\"b\"]]", "{\"model\":\"e\"}"},
};
#define N_OOM_CHECKED 5

START_TEST(test_oom_sweep)
{
    const struct oom *o = &ooms[_i];
    struct task_msg m;
    struct task_call c;
    struct task_error te;
    char *want;
    long n;
    int rc;

    task_msg_init(&m);
    m.args = json(o->args);
    m.kwargs = json(o->kwargs);
    ck_assert_int_eq(tasks_build_call(o->kind, &m, GEN_DEFAULT, EMB_DEFAULT, &c, &te), 0);
    want = c.body;
    c.body = NULL;
    for (n = 1; n < 10000; n++) {
        cr_alloc_fail_after(n);
        rc = tasks_build_call(o->kind, &m, GEN_DEFAULT, EMB_DEFAULT, &c, &te);
        cr_alloc_fail_after(0);
        if (rc == 0) {
            ck_assert_str_eq(c.body, want);
            task_call_release(&c);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_ptr_null(c.body);
    }
    ck_assert_int_gt(n, 1);
    ck_assert_int_lt(n, 10000);
    cr_free(want);
    task_msg_release(&m);
}
END_TEST

START_TEST(test_oom_accumulate)
{
    struct task_msg m;
    struct task_error te;
    cJSON *r = NULL;
    long n;

    task_msg_init(&m);
    m.args = json("[1,[2,3],{\"a\":\"b\"}]");
    m.kwargs = json("{}");
    for (n = 1; n < 1000 && !r; n++) {
        memset(&te, 0, sizeof(te));
        cr_alloc_fail_after(n);
        r = tasks_accumulate(&m, &te);
        cr_alloc_fail_after(0);
    }
    ck_assert_ptr_nonnull(r);
    ck_assert_int_gt(n, 2);
    cJSON_Delete(r);
    task_msg_release(&m);
}
END_TEST

/* An alias must name a built-in: a typo is refused with the alias, the
 * unknown name and the near built-ins. */
START_TEST(test_check_aliases)
{
    char a0[] = "tasks.summarize=llm.generate", a1[] = "tasks.chat=llm.chat";
    char t0[] = "X=llm.generat", t1[] = "Y=generate", t2[] = "Z=tasks.other";
    char *good[] = {a0, a1};
    char *typo[] = {a0, t0};
    char *bare[] = {t1};
    char *other[] = {t2};
    struct cr_err err;

    ck_assert_int_eq(tasks_check_aliases(good, 2, &err), 0);
    ck_assert_int_eq(tasks_check_aliases(NULL, 0, &err), 0);
    ck_assert_int_eq(tasks_check_aliases(typo, 2, &err), CR_EINVAL);
    ck_assert_str_eq(err.msg, "--task-alias 'X=llm.generat': 'llm.generat' is not a "
                              "built-in task (did you mean llm.generate?)");
    ck_assert_int_eq(tasks_check_aliases(bare, 1, &err), CR_EINVAL);
    ck_assert_str_eq(err.msg, "--task-alias 'Y=generate': 'generate' is not a built-in "
                              "task (did you mean llm.generate?)");
    ck_assert_int_eq(tasks_check_aliases(other, 1, &err), CR_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "'tasks.other' is not a built-in task (one of "
                                          "llm.generate,"));
    ck_assert_ptr_null(strchr(err.msg, '\n'));
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("tasks");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_lookup);
    tcase_add_test(tc, test_builtin_names);
    tcase_add_test(tc, test_tools_flag);
    tcase_add_loop_test(tc, test_binding, 0, (int)(sizeof(vecs) / sizeof(vecs[0])));
    tcase_add_loop_test(tc, test_accumulate, 0, (int)(sizeof(accs) / sizeof(accs[0])));
    tcase_add_test(tc, test_accumulate_copies);
    tcase_add_loop_test(tc, test_whole_message, 0,
                        (int)(sizeof(wholes) / sizeof(wholes[0])));
    tcase_add_test(tc, test_long_names_truncate);
    tcase_add_test(tc, test_long_model);
    tcase_add_test(tc, test_check_aliases);
    tcase_add_test(tc, test_big_inputs);
    tcase_add_test(tc, test_message_untouched);
    tcase_add_loop_test(tc, test_oom_sweep, 0, N_OOM_CHECKED);
    tcase_add_test(tc, test_oom_accumulate);
    suite_add_tcase(s, tc);
    return s;
}
