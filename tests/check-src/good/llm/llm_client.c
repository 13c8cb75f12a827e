/* llm_client.c -- fixture: llm/ drives curl on the loop over protocol/ and util/. */
#include <curl/curl.h>
#include <uv.h>

#include "llm_client.h"
#include "policy.h"
#include "protocol/openai.h"
#include "util/redact.h"
