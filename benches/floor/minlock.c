/* The floor under any module lock: the least a Redis module can do for an owner-checked
 * acquire and release. MIN.ACQUIRE key owner stores the owner in a value of a module type
 * when the key is free; MIN.RELEASE key owner deletes the key when the owner matches. One
 * allocation per lock, no token, no timer, no clock, no statistics: only what the module
 * API itself costs (the command dispatch, opening and closing the key, the module value's
 * indirection, the notification and the reply).
 *
 * Not part of flock and never loaded by it: `scripts/bench-floor.sh` builds it and runs
 * the server-cost scenario of `make bench` with it beside flock, so that flock's figures can
 * be read against what a module cannot go below (docs/BENCHMARKS.md, "The module floor"). */
#include "redismodule.h"
#include <string.h>

typedef struct {
    size_t len;
    char owner[64];
} MinLock;

static RedisModuleType *MinLockType;
static long long last_token = 0;

static void min_free(void *value) { RedisModule_Free(value); }

static int min_acquire(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    size_t len;
    const char *owner = RedisModule_StringPtrLen(argv[2], &len);
    if (len > sizeof(((MinLock *)0)->owner)) return RedisModule_ReplyWithError(ctx, "ERR owner too long");
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithNull(ctx);
    }
    MinLock *lock = RedisModule_Alloc(sizeof(*lock));
    lock->len = len;
    memcpy(lock->owner, owner, len);
    RedisModule_ModuleTypeSetValue(key, MinLockType, lock);
    RedisModule_CloseKey(key);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "min.acquired", argv[1]);
    return RedisModule_ReplyWithLongLong(ctx, ++last_token);
}

static int min_release(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_ModuleTypeGetType(key) != MinLockType) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithLongLong(ctx, 0);
    }
    MinLock *lock = RedisModule_ModuleTypeGetValue(key);
    size_t len;
    const char *owner = RedisModule_StringPtrLen(argv[2], &len);
    if (len != lock->len || memcmp(owner, lock->owner, len) != 0) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithLongLong(ctx, 0);
    }
    RedisModule_DeleteKey(key);
    RedisModule_CloseKey(key);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "min.released", argv[1]);
    return RedisModule_ReplyWithLongLong(ctx, 1);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "minlock", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    RedisModuleTypeMethods methods = {.version = REDISMODULE_TYPE_METHOD_VERSION, .free = min_free};
    MinLockType = RedisModule_CreateDataType(ctx, "minlock-0", 1, &methods);
    if (MinLockType == NULL) return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "min.acquire", min_acquire, "write deny-oom", 1, 1, 1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "min.release", min_release, "write fast", 1, 1, 1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
